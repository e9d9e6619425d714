"""The training loop's pieces (vit/train/engine.py), the quiet console (vit/train/console.py), file modes."""

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import ROOT, TINY, run_script

from vit.train.console import MIN_STEPS, describe_model, processes, schedule_warning
from vit.train.engine import TrainState, state_save_due


def _saves(epochs: int, batches: int, every: int, max_steps: int | None = None) -> list[tuple[int, str]]:
    """Walk a run (one batch per optimizer step) through the policy as train.py does: (step, moment) of each save."""
    s, out = TrainState(), []
    while s.epoch < epochs and not (max_steps and s.step >= max_steps):
        while s.batch_in_epoch < batches:
            s.batch_in_epoch, s.step = s.batch_in_epoch + 1, s.step + 1
            if state_save_due(s, every, batches, "step"):
                out.append((s.step, "step"))
            if max_steps and s.step >= max_steps:
                break
        if s.batch_in_epoch >= batches:
            s.epoch, s.batch_in_epoch = s.epoch + 1, 0
        elif state_save_due(s, every, batches, "stop"):
            out.append((s.step, "stop"))
        if state_save_due(s, every, batches, "epoch"):
            out.append((s.step, "epoch"))
    return out


def test_one_save_policy_gives_the_documented_schedule():
    # 3 epochs of 5 steps, a state every 2 steps (the crash test's run): mid-epoch at 2, 4, 6, 8, 12, 14; an epoch's
    # last step (10) is saved once, after its evaluation, as is every epoch's end
    assert _saves(3, 5, 2) == [(2, "step"), (4, "step"), (5, "epoch"), (6, "step"), (8, "step"), (10, "epoch"),
                               (12, "step"), (14, "step"), (15, "epoch")]
    assert _saves(3, 5, 0) == [(5, "epoch"), (10, "epoch"), (15, "epoch")]  # 0: epoch ends only
    # max_steps mid-epoch: saved before evaluating; not twice when the periodic save just ran
    assert _saves(3, 5, 0, max_steps=7) == [(5, "epoch"), (7, "stop")]
    assert _saves(3, 5, 2, max_steps=8) == [(2, "step"), (4, "step"), (5, "epoch"), (6, "step"), (8, "step")]
    assert _saves(3, 5, 3, max_steps=10) == [(3, "step"), (5, "epoch"), (6, "step"), (9, "step"), (10, "epoch")]


def test_schedule_warnings():
    assert "warm-up (69 steps) is not shorter than the run (46 steps)" in schedule_warning(46, 69, 2, False)
    assert "only 46 optimizer steps" in schedule_warning(46, 10, 2, False)
    assert schedule_warning(46, 10, 2, True) is None  # fine-tuning pretrained weights may take few steps
    assert schedule_warning(MIN_STEPS, 10, 5, False) is None
    assert schedule_warning(1380, 69, 60, False) is None  # the digits default
    # run.max_steps ends the run early: the warning counts the steps that run, not the schedule's
    assert "not shorter than the run (run.max_steps=5)" in schedule_warning(23, 8, 1, False, max_steps=5)
    assert schedule_warning(1380, 69, 60, False, max_steps=200) is None
    assert "(46 steps)" in schedule_warning(46, 69, 2, False, max_steps=100)  # max_steps beyond the run


def test_device_line_says_ddp_or_fsdp():
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    acc = SimpleNamespace(num_processes=2, distributed_type=DistributedType.FSDP)
    assert processes(acc) == "2 FSDP processes"
    acc.distributed_type = DistributedType.MULTI_CPU
    assert processes(acc) == "2 DDP processes"
    assert processes(SimpleNamespace(num_processes=1, distributed_type=DistributedType.NO)) == "1 process"


def test_model_line_names_what_was_built():
    import timm

    from vit import create_model

    kw = dict(img_size=48, embed_dim=48, depth=3, num_heads=3, mlp_ratio=2, num_classes=5)
    ours = create_model("vit_tiny_patch16_224", **kw)
    oracle = sum(p.numel() for p in timm.create_model("vit_tiny_patch16_224", pretrained=False, **kw).parameters())
    line = describe_model(ours, "vit_tiny_patch16_224")
    assert line == (f"vit_tiny_patch16_224 as built: 3 channels (RGB), width 48, depth 3, 3 heads, patch 16, "
                    f"10 tokens (3x3 + 1), {oracle / 1e6:.2f}M params")


def test_progress_in_a_log_file_is_plain_lines(capsys, monkeypatch):
    from types import SimpleNamespace

    import vit.train.console as console

    monkeypatch.setattr(console, "PLAIN_EVERY_S", 0.0)  # a line at every step instead of every 30 s
    c = console.Console(SimpleNamespace(is_main_process=True))
    c.start_progress(total=4, initial=1)  # resumed at step 1; pytest's captured stdout is not a terminal
    c.step(loss="0.500", lr="1.00e-03")
    c.print("epoch   1  ...")
    c.step()
    c.close()
    silent = console.Console(SimpleNamespace(is_main_process=False))  # other processes print nothing
    silent.start_progress(total=4, initial=0)
    silent.step(loss="9")
    silent.print("never")
    out = capsys.readouterr()
    assert c.bar is None and "\r" not in out.out + out.err and out.err == ""
    assert out.out.splitlines() == ["step 2/4 (50%)  loss 0.500  lr 1.00e-03", "epoch   1  ...",
                                    "step 3/4 (75%)  loss 0.500  lr 1.00e-03"]


def test_the_finite_check_runs_once_per_optimizer_step_and_skips_the_whole_step(tmp_path, monkeypatch):
    """Two micro-batches per step: no cross-process reduce per micro-batch, one norm per optimizer step, and a NaN
    loss in either micro-batch skips the step (weights and optimizer untouched) under run.on_nonfinite=skip."""
    from accelerate.state import AcceleratorState, GradientState

    from vit.cli.runtime import make_accelerator
    from vit.config import load_config
    from vit.data import build_datasets, build_loaders
    from vit.models.build import build_model
    from vit.train.console import Console
    from vit.train.engine import Run, train_one_epoch
    from vit.train.optim import build_optimizer

    cfg = load_config(ROOT / "configs/default.yaml", [
        "--data.dataset=synthetic", "--data.synthetic_train_size=32", "--data.synthetic_val_size=4", *TINY,
        "--optim.grad_accum_steps=2", "--optim.warmup_epochs=0", "--run.on_nonfinite=skip", "--model.in_chans=3",
        f"--run.output_dir={tmp_path}"])
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    try:
        acc = make_accelerator(gradient_accumulation_steps=2)
        train_ds, val_ds, classes = build_datasets(cfg)
        model = build_model(cfg, len(classes))
        opt = build_optimizer(model, cfg.optim)
        tl, vl = build_loaders(cfg, train_ds, val_ds)
        model, opt, tl, vl = acc.prepare(model, opt, tl, vl)
        run = Run(acc, cfg, tmp_path / "r", model, opt, tl, vl, classes, Console(acc))
        calls = {"reduce": 0, "norm": 0}
        reduce, norm = acc.reduce, acc.clip_grad_norm_
        monkeypatch.setattr(acc, "reduce", lambda *a, **k: (calls.__setitem__("reduce", calls["reduce"] + 1),
                                                            reduce(*a, **k))[1])
        monkeypatch.setattr(acc, "clip_grad_norm_", lambda *a, **k: (calls.__setitem__("norm", calls["norm"] + 1),
                                                                     norm(*a, **k))[1])
        weights = []
        orig_step = opt.step

        def step(*a, **k):
            orig_step(*a, **k)
            weights.append(acc.unwrap_model(model).head.weight.detach().clone())
        monkeypatch.setattr(opt, "step", step)
        monkeypatch.setenv("VIT_FAULT_INJECT", "nan:1")  # optimizer step 1 (its two micro-batches) is NaN
        before = acc.unwrap_model(model).head.weight.detach().clone()
        stats = train_one_epoch(run)
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    assert len(tl) == 4 and run.state.step == 2 and run.state.batch_in_epoch == 0 and run.state.epoch == 1
    assert calls == {"reduce": 1, "norm": 2}  # the epoch's mean loss only; one gradient norm per optimizer step
    assert run.state.skipped == 1 and len(weights) == 1  # step 0 applied, step 1 skipped
    assert not torch.equal(weights[0], before)
    assert torch.equal(acc.unwrap_model(model).head.weight, weights[0])  # the NaN step changed nothing
    assert all(p.grad is None for p in model.parameters())
    assert torch.isfinite(torch.tensor(stats.train_loss))  # the NaN micro-batches are not in the epoch's loss


def test_a_resumed_epoch_trains_on_the_batches_it_had_not_reached(tmp_path):
    """A state taken after 2 of epoch 1's 5 batches: the resumed epoch trains on exactly the loader's own batches 3-5
    of epoch 1's permutation (seed, epoch), none twice, none lost (train.py's slow preemption test, in one step)."""
    from accelerate.state import AcceleratorState, GradientState

    from vit.cli.runtime import make_accelerator
    from vit.config import load_config
    from vit.data import build_datasets, build_loaders
    from vit.models.build import build_model
    from vit.train.console import Console
    from vit.train.engine import Run, train_one_epoch
    from vit.train.optim import build_optimizer

    cfg = load_config(ROOT / "configs/default.yaml", [
        "--data.dataset=synthetic", "--data.synthetic_train_size=40", "--data.synthetic_val_size=4", *TINY,
        "--optim.warmup_epochs=0", "--model.in_chans=3", "--run.epochs=3", f"--run.output_dir={tmp_path}"])
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    try:
        acc = make_accelerator()
        train_ds, val_ds, classes = build_datasets(cfg)
        model = build_model(cfg, len(classes))
        opt = build_optimizer(model, cfg.optim)
        tl, vl = build_loaders(cfg, train_ds, val_ds)
        model, opt, tl, vl = acc.prepare(model, opt, tl, vl)

        def batches(epoch: int) -> tuple[list[torch.Tensor], torch.Tensor]:  # the oracle: the loader's own order
            train_ds.set_epoch(epoch)
            tl.set_epoch(epoch)
            xs, ys = zip(*((x.clone(), y) for x, y in tl))
            return list(xs), torch.cat(ys)
        (_, labels0), (expected, labels1) = batches(0), batches(1)
        seen = []
        acc.unwrap_model(model).register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach().clone()))
        run = Run(acc, cfg, tmp_path / "r", model, opt, tl, vl, classes, Console(acc))
        run.state = TrainState(epoch=1, step=7, batch_in_epoch=2)  # as a state saved at that point restores it
        train_one_epoch(run)
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    assert len(expected) == 5 and not torch.equal(labels0, labels1)  # each epoch its own permutation
    order = [next((i for i, b in enumerate(expected) if torch.equal(a, b)), None) for a in seen]
    assert order == [2, 3, 4]  # which of epoch 1's batches the resumed epoch trained on (None: another epoch's)
    assert (run.state.epoch, run.state.batch_in_epoch, run.state.step) == (2, 0, 10)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [0o077, 0o002])
def test_written_files_honour_the_umask(tmp_path, umask):
    from vit import create_model
    from vit.config import load_config
    from vit.models.checkpoint import save_checkpoint
    from vit.utils.atomic import atomic_write_csv, atomic_write_text

    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        atomic_write_csv(tmp_path / "m.csv", ["k"], [{"k": 1}])
        cfg = load_config(ROOT / "configs/default.yaml", TINY)
        save_checkpoint(tmp_path / "ck", create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=2),
                        cfg, ["a", "b"], {"step": 1})
        os.chmod(tmp_path / "a.txt", 0o600)  # a file the user restricted keeps its mode when rewritten
        atomic_write_text(tmp_path / "a.txt", "y")
    finally:
        os.umask(old)
    expected = 0o666 & ~umask
    files = [tmp_path / "m.csv", *sorted((tmp_path / "ck").iterdir())]
    assert len(files) == 7 and (tmp_path / "ck" / "README.md") in files  # m.csv, the checkpoint's six (its card)
    assert {f.name: _mode(f) for f in files} == {f.name: expected for f in files}
    assert _mode(tmp_path / "a.txt") == 0o600 and (tmp_path / "a.txt").read_text() == "y"
    assert not list(tmp_path.rglob("*.tmp"))


def test_atomic_writing_imports_nothing_heavy():
    """vit.utils.atomic (and the package above it) loads no torch, numpy or matplotlib, and no other vit module
    than its own helper (utils/untrusted_text.py) and the light package faces."""
    code = ("import sys, vit.utils.atomic; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'numpy', 'matplotlib') or m.startswith('vit')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    assert out.strip() == str(["vit", "vit.utils", "vit.utils.atomic", "vit.utils.untrusted_text"])
    # and drawing a PNG no longer reaches the checkpoint (model) module
    assert "checkpoint" not in (ROOT / "vit/eval/plots.py").read_text()


def _launch_flags() -> list[str]:
    """`accelerate launch -q` with every launch value given, as README's Training section says to launch."""
    return ["--quiet", "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no"]


def test_make_train_runs_train_py():
    """`make train` starts train.py with the venv's python (the launcher's start would cost 5% of the main job)."""
    recipe = (ROOT / "Makefile").read_text().split("\ntrain:", 1)[1].splitlines()[1]
    assert re.fullmatch(r"\t\$\(PY\) train\.py \$\(ARGS\)", recipe)


@pytest.mark.slow
def test_make_train_console_is_quiet_and_an_error_is_one_sentence(tmp_path):
    launcher = [sys.executable, "-m", "accelerate.commands.launch", *_launch_flags()]
    env = {"TQDM_DISABLE": ""}  # no progress bar because the output is not a terminal, not because of this
    old = os.umask(0o002)  # inherited by the training: every file it writes must be 0664, not mkstemp's 0600
    try:
        r = run_script("train.py", "--data.dataset=synthetic", "--data.synthetic_train_size=24",
                       "--data.synthetic_val_size=8", "--run.epochs=2", f"--run.output_dir={tmp_path}",
                       "--run.name=q", *TINY, launcher=launcher, env=env)
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr[-3000:]
    files = [f for f in (tmp_path / "q").rglob("*") if f.is_file() and f.name != ".lock"]
    assert len(files) > 10 and {str(f): _mode(f) for f in files} == {str(f): 0o664 for f in files}
    out = r.stdout + r.stderr
    assert "\r" not in out and "were not passed" not in out and "gpuGetDeviceCount" not in out
    lines = r.stdout.splitlines()
    assert lines[0].startswith("settings: configs/default.yaml with ") and "run.epochs=2" in lines[0]
    assert [ln for ln in lines if ln.startswith("epoch ")] == [ln for ln in lines if "  val loss " in ln]
    assert len([ln for ln in lines if ln.startswith("epoch ")]) == 2
    assert "width 32, depth 2, 2 heads, patch 16, 5 tokens (2x2 + 1)" in r.stdout
    assert "only 6 optimizer steps" in r.stdout  # 2 epochs of 3 batches: the short-run warning
    assert "  name: " not in r.stdout  # no config dump: it is in the run folder
    assert (tmp_path / "q/config.yaml").is_file()
    bad = run_script("train.py", "--optim.lr=-1", f"--run.output_dir={tmp_path}", launcher=launcher)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr + bad.stdout
    assert bad.stderr.strip().splitlines() == ["error: config key 'optim.lr' must not be negative, got -1.0."]


def _epochs_disagreeing():
    """Two epochs' validation predictions on 20 + 20 + 2 images: epoch 1 misses both images of the rare class
    (top-1 40/42), epoch 2 gets them and misses 3 common ones (top-1 39/42). (preds, labels) per epoch."""
    labels = torch.tensor([0] * 20 + [1] * 20 + [2] * 2)
    first = labels.clone()
    first[40:] = 0
    second = labels.clone()
    second[:3] = 1
    return [(first, labels), (second, labels)]


@pytest.mark.parametrize("select_by, best_epoch", [(None, 1), ("top1", 1), ("macro_f1", 2),
                                                   ("balanced_accuracy", 2), ("loss", 2)])
def test_best_is_chosen_by_run_select_by(tmp_path, select_by, best_epoch):
    import json
    from types import SimpleNamespace

    from vit.config import load_config
    from vit.eval.metrics import class_balanced_scores
    from vit.models.build import build_model
    from vit.train.records import keep_best

    over = ["--data.dataset=synthetic", "--model.img_size=16", "--model.patch_size=8", "--model.embed_dim=16",
            "--model.depth=1", "--model.num_heads=2", "--run.keep_best=2"]
    cfg = load_config(None, over + ([f"--run.select_by={select_by}"] if select_by else []))
    run = SimpleNamespace(cfg=cfg, state=TrainState(), run_dir=tmp_path, classes=["a", "b", "rare"])
    model = build_model(cfg, 3)
    for epoch, ((preds, labels), loss) in enumerate(zip(_epochs_disagreeing(), (0.9, 0.7)), start=1):
        scores = class_balanced_scores(preds, labels, 3)
        meta = dict(epoch=epoch, step=10 * epoch, val_acc1=float((preds == labels).double().mean()), val_loss=loss,
                    val_macro_f1=scores["macro_f1"], val_balanced_accuracy=scores["balanced_accuracy"])
        keep_best(run, model, meta)
    assert json.loads((tmp_path / "best" / "meta.json").read_text())["epoch"] == best_epoch
    assert [e for _, e in run.state.best] == [best_epoch, 3 - best_epoch]  # the runner-up kept in top/
    assert sorted(p.name for p in (tmp_path / "top").iterdir()) == ["epoch-0001", "epoch-0002"]



def test_select_by_defaults_to_map_for_multi_label_data_and_follows_the_setting():
    """A multi-label run logs val_map and no val_acc1: left unset, run.select_by must rank by mAP there."""
    from vit.config import load_config
    from vit.train.records import SELECT_BY, select_by

    def cfg(labels_file, chosen=None):
        data = {"data.dataset": "imagefolder", "data.root": "x", "data.labels_file": labels_file} if labels_file else {}
        return load_config(None, {**data, **({"run.select_by": chosen} if chosen else {})})

    assert select_by(cfg("labels.csv")) == "map" and SELECT_BY["map"][0] == "val_map"
    assert select_by(cfg(None)) == "top1" and select_by(cfg("labels.csv", "loss")) == "loss"

def test_rank_best_keeps_the_earlier_epoch_on_a_tie_and_ranks_loss_lowest_first():
    from vit.train.records import rank_best

    assert rank_best([[0.5, 1]], 0.5, 2) == [[0.5, 1], [0.5, 2]]
    assert rank_best([[0.5, 1]], 0.6, 2) == [[0.6, 2], [0.5, 1]]
    assert rank_best([[0.5, 1]], 0.4, 2, higher_is_better=False) == [[0.4, 2], [0.5, 1]]


def test_a_class_with_few_validation_images_is_one_warning():
    from vit.train.console import rare_class_warning

    msg = rare_class_warning([20, 20, 2], ["a", "b", "owl"], None)
    assert msg.startswith("warning: 1 of 3 classes have fewer than 5 validation images (owl: 2)")
    assert "run.select_by=balanced_accuracy" in msg and msg.count(". ") == 0 and msg.endswith(".")
    assert "run.select_by" not in rare_class_warning([20, 20, 2], ["a", "b", "owl"], "macro_f1")
    assert rare_class_warning([5, 5, 5], ["a", "b", "c"], None) is None
    assert rare_class_warning(None, ["a", "b", "c"], None) is None  # a split that does not list its labels


def test_select_by_must_fit_the_kind_of_labels():
    from vit.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"'run.select_by' is map, which needs multi-label data"):
        load_config(None, ["--run.select_by=map"])
    with pytest.raises(ConfigError, match=r"'run.select_by' must be one of 'top1', 'macro_f1'"):
        load_config(None, ["--run.select_by=f1"])
