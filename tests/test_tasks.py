"""The training task seam (vit/train/tasks): which task a config trains, and a task written outside the package
(a toy regression with an extra module and a resume state) driven by the engine, its loss against a float64 hand
computation."""

import json

import pytest
import torch
from helpers import ROOT

from vit.config import load_config
from vit.train.tasks import (
    TASKS,
    ClassificationTask,
    ContrastiveTask,
    Evaluation,
    MultiLabelTask,
    Task,
    task_class,
    task_for,
    task_name,
)


@pytest.mark.parametrize("over, expected", [
    ({}, ClassificationTask),
    ({"data.dataset": "synthetic"}, ClassificationTask),
    ({"data.dataset": "text_csv", "data.root": "t.csv", "model.pretrained": "hf-hub:a/b"},
     ClassificationTask),  # texts: the same loss, metrics and checkpoint choice
    ({"data.dataset": "imagefolder", "data.root": "x", "data.labels_file": "l.csv"}, MultiLabelTask),
    ({"data.dataset": "captions", "data.root": "x"}, ContrastiveTask),
])
def test_each_config_trains_its_task(over, expected):
    from vit.train.records import select_by

    cfg = load_config(None, over)
    task = task_for(cfg, ["a", "b"])
    assert type(task) is expected and TASKS[task_name(cfg)] is expected
    assert select_by(cfg) == ("map" if expected is MultiLabelTask else "top1") == task.select_by


def test_an_unknown_task_is_one_sentence():
    with pytest.raises(ValueError) as e:
        task_class("regression")
    msg = str(e.value)
    assert msg == ("unknown training task 'regression'; the tasks are 'classification', 'multilabel', "
                   "'contrastive', 'distillation', 'dino', 'mae', 'segmentation'.")


class Regression(Task):
    """A toy mode: the model's one output regressed on a float target through a learned scale (an extra module),
    counting its steps in a state that a resume must restore."""

    select_by = "loss"

    def __init__(self, cfg, classes):
        super().__init__(cfg, classes)
        self.scale = torch.nn.Linear(1, 1)
        self.steps, self.seen = 0, []  # seen: (x, y, weight, bias, scale weight, scale bias) at each loss

    def extra_modules(self):
        return {"scale": self.scale}

    def loss(self, run, x, y):
        snap = (run.model.weight, run.model.bias, run.extras["scale"].weight, run.extras["scale"].bias)
        self.seen.append((x, y, *(t.detach().clone() for t in snap)))
        return ((run.extras["scale"](run.model(x)).squeeze(-1) - y) ** 2).mean()

    def after_step(self, run):
        self.steps += 1

    def task_state(self):
        return {"steps": self.steps}, {"last_seen": self.seen[-1][0][:1] if self.seen else torch.zeros(1, 3)}

    def load_task_state(self, values, tensors):
        self.steps, self.loaded = values["steps"], tensors["last_seen"]

    def evaluate(self, run, model):
        sq = [run.accelerator.gather_for_metrics((run.extras["scale"](model(x)).squeeze(-1) - y) ** 2) for x, y in
              run.val_loader]
        loss = torch.cat(sq).mean().item()
        return Evaluation(f"val mse {loss:.4f}", {"val_loss": loss}, {"val_loss": loss, "n": len(torch.cat(sq))})

    def save(self, folder, model, meta, weights=None):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "meta.json").write_text(json.dumps(meta))


def _hand_loss(x, y, w, b, sw, sb) -> float:
    """float64: mean((sw * (x @ w.T + b) + sb - y)^2)."""
    x, y, w, b, sw, sb = (t.double() for t in (x, y, w, b, sw, sb))
    return float((((x @ w.T + b) * sw[0, 0] + sb[0]).squeeze(-1) - y).pow(2).mean())


def _run(tmp_path, cfg, task):
    from accelerate.state import AcceleratorState, GradientState
    from torch.utils.data import DataLoader, TensorDataset

    from vit.cli.runtime import make_accelerator
    from vit.train.console import Console
    from vit.train.engine import Run
    from vit.train.lifecycle import prepare
    from vit.train.optim import build_optimizer

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    acc = make_accelerator()
    g = torch.Generator().manual_seed(0)
    x, val_x = torch.randn(24, 3, generator=g), torch.randn(8, 3, generator=g)
    target = torch.tensor([1.0, -2.0, 0.5])
    train = DataLoader(TensorDataset(x, x @ target + 0.3), batch_size=8, shuffle=True)
    val = DataLoader(TensorDataset(val_x, val_x @ target + 0.3), batch_size=8)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    extras = task.extra_modules()
    opt = build_optimizer(model, cfg.optim, extras.values())
    model, opt, train, val, extras = prepare(acc, model, opt, train, val, extras=extras)
    return Run(acc, cfg, tmp_path / "r", model, opt, train, val, [], Console(acc), task=task, extras=extras)


def test_a_task_from_outside_the_package_trains_evaluates_and_resumes_through_the_engine(tmp_path):
    from accelerate.state import AcceleratorState, GradientState

    from vit.train.engine import evaluate_and_checkpoint, train_one_epoch
    from vit.train.runfolder import resume_run, save_run_state

    over = {"optim.warmup_epochs": 0, "optim.lr": 0.05, "optim.weight_decay": 0.0, "run.epochs": 2,
            "run.log_every": 1, "run.eval_every": 1, "run.output_dir": str(tmp_path), "data.batch_size": 8}
    cfg = load_config(ROOT / "configs/default.yaml", over)
    task = Regression(cfg, [])
    try:
        run = _run(tmp_path, cfg, task)
        (tmp_path / "r").mkdir()
        scale_before = task.scale.weight.detach().clone()
        stats = train_one_epoch(run)
        evaluate_and_checkpoint(run, stats)
        save_run_state(run.accelerator, cfg, run.run_dir, run.state, run.model, None, 0.0, 0, task)
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    assert len(task.seen) == 3 and task.steps == 3 == run.state.step  # after_step once per optimizer step
    hand = [_hand_loss(*seen) for seen in task.seen]
    assert stats.train_loss == pytest.approx(sum(hand) / 3, rel=1e-6)  # the loss the loop reports is the task's
    assert len({round(h, 6) for h in hand}) == 3 and not torch.equal(task.scale.weight, scale_before)  # it trained
    assert json.loads((tmp_path / "r" / "best" / "meta.json").read_text())["epoch"] == 1  # the task's own writer
    assert run.state.best[0][1] == 1  # ranked by the task's select_by (loss: val_acc1 is not in its meta)
    (state,) = (tmp_path / "r" / "state").glob("step-*")
    assert json.loads((state / "task_state.json").read_text()) == {"steps": 3}

    fresh = Regression(load_config(ROOT / "configs/default.yaml", {**over, "run.resume": "auto"}), [])
    try:
        resumed = _run(tmp_path, fresh.cfg, fresh)
        resume_run(resumed.accelerator, fresh.cfg, resumed.run_dir, resumed.state, None, fresh)
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    assert fresh.steps == 3 and torch.equal(fresh.loaded, task.seen[-1][0][:1])  # JSON and safetensors, no pickle
    assert torch.equal(fresh.scale.weight, task.scale.weight)  # the extra module is in Accelerate's state


def test_a_state_without_the_task_state_the_task_keeps_is_refused(tmp_path):
    from vit.train.runfolder import TASK_STATE_JSON
    from vit.train.runfolder import read_task_state as load

    task = Regression(load_config(None), [])
    with pytest.raises(ValueError, match=f"it holds no {TASK_STATE_JSON} or task_state.safetensors, which "
                                         "Regression keeps"):
        load(task, tmp_path)
    load(ClassificationTask(load_config(None), ["a"]), tmp_path)  # a task without state needs none


def test_the_classification_task_takes_mixup_and_class_weights_from_the_config():
    cfg = load_config(None, {"aug.mixup": 0.2, "data.dataset": "synthetic"})
    task = task_for(cfg, ["a", "b", "c"])
    assert task.mixup is not None and task.mixup.num_classes == 3 and task.class_weights is None
    assert task_for(load_config(None), ["a"]).mixup is None
