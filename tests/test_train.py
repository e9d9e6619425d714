"""train.py end to end on tiny models: run folder contents, exact resume, mixup, two processes."""

import csv
import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import ROOT, TINY, make_image_folder, run_script
from safetensors.torch import load_file


def _rows(run):
    with open(run / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_end_to_end_on_generated_image_folder(tmp_path):
    data = make_image_folder(tmp_path / "folder")
    out = tmp_path / "runs"
    r = run_script("train.py", "--data.dataset=imagefolder", f"--data.root={data}", f"--run.output_dir={out}",
                   "--run.name=t", "--run.epochs=4", "--optim.lr=3e-3", *TINY)
    assert r.returncode == 0, r.stderr[-3000:]
    run = out / "t"
    for f in ("config.yaml", "metrics.csv", "curves.png", "best/model.safetensors", "best/classes.json",
              "last/config.yaml", "last/meta.json"):
        assert (run / f).is_file(), f
    assert list((run / "tensorboard").rglob("events.out.tfevents.*"))
    assert json.loads((run / "best/classes.json").read_text()) == ["cat", "dog", "fox"]
    rows = _rows(run)
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3, 4]
    assert float(rows[-1]["val_acc1"]) > 0.6  # 3 colour-coded classes: far above chance (1/3)
    assert float(rows[-1]["train_loss"]) < float(rows[0]["train_loss"])
    # the checkpoint alone rebuilds the model and reproduces the logged accuracy
    from vit.models.checkpoint import load_checkpoint

    model, cfg, classes, meta = load_checkpoint(run / "last")
    assert cfg.data.root == str(data) and meta["n"] == 15
    assert cfg.run.mixed_precision == "no"  # the precision that ran is saved, not null


@pytest.mark.slow
def test_resume_reproduces_uninterrupted_run_exactly(tmp_path):
    common = ["--data.dataset=synthetic", "--data.synthetic_train_size=40", "--data.synthetic_val_size=12",
              "--run.epochs=3", "--model.drop_path_rate=0.1", "--aug.mixup=0.5", "--aug.cutmix=0.5",
              "--aug.random_resized_crop=true", *TINY]
    a = run_script("train.py", *common, f"--run.output_dir={tmp_path}", "--run.name=a")
    assert a.returncode == 0, a.stderr[-3000:]
    # b: stop mid-epoch 2 (step 7 of 15), then resume
    b1 = run_script("train.py", *common, f"--run.output_dir={tmp_path}", "--run.name=b", "--run.max_steps=7")
    assert b1.returncode == 0, b1.stderr[-3000:]
    b2 = run_script("train.py", *common, f"--run.output_dir={tmp_path}", "--run.name=b", "--resume=auto")
    assert b2.returncode == 0, b2.stderr[-3000:]
    assert "resumed from" in b2.stdout
    wa = load_file(str(tmp_path / "a/last/model.safetensors"))
    wb = load_file(str(tmp_path / "b/last/model.safetensors"))
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    steps = [int(r["step"]) for r in _rows(tmp_path / "b")]
    assert steps == sorted(set(steps)) and steps[-1] == 15
    assert [r["epoch"] for r in _rows(tmp_path / "b")][-3:] == ["1", "2", "3"]


def test_mixup_with_odd_last_batch():
    from timm.data import Mixup

    from vit.train.tasks.classification import mix_batch

    fn = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=4)
    x, y = torch.randn(5, 3, 8, 8), torch.tensor([0, 1, 2, 3, 1])
    xm, ym = mix_batch(fn, x, y, 4, 0.1)
    assert xm.shape == x.shape and ym.shape == (5, 4)
    torch.testing.assert_close(ym.sum(1), torch.ones(5))
    torch.testing.assert_close(xm[-1], x[-1])
    torch.testing.assert_close(ym[-1], torch.tensor([0.025, 0.925, 0.025, 0.025]))


def test_bad_config_fails_in_one_sentence_and_writes_nothing(tmp_path):
    r = run_script("train.py", "--optim.lr=-1", f"--run.output_dir={tmp_path}")
    assert r.returncode == 2
    assert "optim.lr" in r.stderr and "Traceback" not in r.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_two_processes_evaluate_every_sample_once(tmp_path):
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
                "29531"]
    r = run_script("train.py", "--data.dataset=synthetic", "--data.synthetic_train_size=30",
                   "--data.synthetic_val_size=13", "--run.epochs=1", f"--run.output_dir={tmp_path}",
                   "--run.name=ddp", *TINY, launcher=launcher, env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 DDP processes" in r.stdout
    meta = json.loads((tmp_path / "ddp/last/meta.json").read_text())
    assert meta["n"] == 13


@pytest.mark.slow
def test_run_outside_the_repository_with_a_relative_data_root(tmp_path):
    """From another directory: configs/default.yaml is found next to train.py, and the run's saved config holds
    data.root as an absolute path, so evaluate.py run from yet another directory finds the data."""
    make_image_folder(tmp_path / "data", n_train=4, n_val=2)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "train.py"), *TINY, "--data.dataset=imagefolder",
                        "--data.root=data", "--run.output_dir=runs", "--run.name=rel", "--run.epochs=1",
                        "--run.max_steps=1"], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    for saved in ("runs/rel/config.yaml", "runs/rel/best/config.yaml"):
        assert f"root: {tmp_path / 'data'}" in (tmp_path / saved).read_text(), saved
    r = run_script("evaluate.py", "--checkpoint", str(tmp_path / "runs/rel/best"), "--out", str(tmp_path / "ev"))
    assert r.returncode == 0, r.stderr[-2000:]


def test_absolute_root_keeps_urls_and_missing_paths(tmp_path, monkeypatch):
    from vit.data import absolute_root

    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    assert absolute_root("d") == str(tmp_path / "d")
    assert absolute_root("missing") == "missing" and absolute_root(None) is None
    assert absolute_root("https://x/shards") == "https://x/shards" and absolute_root("pipe:cat x") == "pipe:cat x"


@pytest.mark.slow
def test_ddp_with_one_image_per_process_prints_no_grad_strides_warning(tmp_path):
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
                "29535"]
    r = run_script("train.py", "--data.dataset=synthetic", "--data.synthetic_train_size=8",
                   "--data.synthetic_val_size=4", "--run.epochs=1", "--run.max_steps=2", f"--run.output_dir={tmp_path}",
                   *TINY, "--data.batch_size=1", launcher=launcher, env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Grad strides do not match" not in r.stderr  # cls_token's (1, 1, D) gradient: see vit/cli/runtime.py
