"""Self-supervised pretraining (pretrain.method: dino): the section's refusals, unlabelled folders of any layout,
DINO's multi-crop, the teacher's EMA step against a float64 formula, and train.py runs: a resume equal to an
uninterrupted run (teacher and centre included), the backbone alone in a folder timm loads strict, a forced
collapse stopped with one sentence."""

from __future__ import annotations

import csv
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import make_image_folder, run_script
from PIL import Image

from vit.config import ConfigError, load_config
from vit.config.pretrain_checks import METHODS
from vit.data import DataError
from vit.data.pretrain import build_pretrain_datasets as build_datasets

DINO = {"pretrain.method": "dino", "pretrain.out_dim": 64, "pretrain.hidden_dim": 32, "pretrain.bottleneck_dim": 16,
        "pretrain.local_crops": 2}


@pytest.mark.parametrize("over, words", [
    ({"pretrain.method": "byol"}, "'pretrain.method' must be one of dino, mae (or null), got 'byol'"),
    ({**DINO, "pretrain.local_size": 96}, "96 pixels, larger than the 64-pixel image"),
    ({"pretrain.method": "mae", "pretrain.mask_ratio": 0.0}, "'pretrain.mask_ratio' must lie in (0.0, 1.0)"),
    ({"pretrain.method": "mae", "pretrain.mask_ratio": 1.0}, "'pretrain.mask_ratio' must lie in (0.0, 1.0)"),
    ({**DINO, "pretrain.ibot_weight": 1.0, "pretrain.mask_ratio": 1.0}, "'pretrain.mask_ratio' must lie in"),
    ({"pretrain.local_crops": 2}, "'pretrain.local_crops' is read only with pretrain.method set"),
    ({"pretrain.method": "mae", "pretrain.local_crops": 2}, "not read by pretrain.method=mae"),
])
def test_bad_pretrain_settings_are_one_sentence(over, words):
    with pytest.raises(ConfigError) as e:
        load_config("configs/default.yaml", [f"--{k}={v}" for k, v in over.items()])
    assert words in str(e.value) and str(e.value).count(". ") <= 1
    assert METHODS == ("dino", "mae")  # the methods the first sentence lists


def _pngs(folder, n, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)).save(folder / f"{i}.png")


def _cfg(root, **over):
    return load_config("configs/default.yaml", [f"--{k}={v}" for k, v in
                                                {"data.dataset": "imagefolder", "data.root": root, **DINO,
                                                 **over}.items()])


def test_any_layout_is_read_and_an_empty_folder_is_one_sentence(tmp_path):
    _pngs(tmp_path / "flat", 5)
    _pngs(tmp_path / "nested" / "train" / "a", 3)
    _pngs(tmp_path / "nested" / "val" / "b", 2)
    (tmp_path / "empty" / "a").mkdir(parents=True)
    for name, n in (("flat", 5), ("nested", 5)):
        train, val, classes = build_datasets(_cfg(tmp_path / name, **{"data.val_fraction": 0.2}))
        assert (len(train), len(val), classes) == (n - 1, 1, [])  # every image, labels and splits ignored
    with pytest.raises(DataError, match=r"holds no image file .*, so there is nothing to pretrain on"):
        build_datasets(_cfg(tmp_path / "empty"))


def test_multi_crop_gives_global_and_local_crops_seeded_per_sample(tmp_path):
    _pngs(tmp_path / "f", 2)
    train, _, _ = build_datasets(_cfg(tmp_path / "f", **{"data.val_fraction": 0.0}))
    crops, label = train[0]
    assert label == 0 and [tuple(c.shape) for c in crops] == [(3, 64, 64)] * 2 + [(3, 32, 32)] * 2
    again, _ = train[0]
    assert all(torch.equal(a, b) for a, b in zip(crops, again))  # (seed, epoch, index): reproducible on resume
    assert not torch.equal(crops[0], crops[1])  # each crop its own draw
    train.set_epoch(1)
    assert not torch.equal(train[0][0][0], crops[0])


def test_the_teacher_moves_by_its_cosine_momentum(tmp_path):
    from accelerate import Accelerator

    from vit.models import create_model
    from vit.train.ssl_losses import teacher_momentum
    from vit.train.tasks.pretrain import DinoTask

    cfg = _cfg(tmp_path)
    model = create_model("vit_tiny_patch16_224", img_size=32, embed_dim=16, depth=1, num_heads=2, num_classes=0)
    task = DinoTask.from_config(cfg, [], model=model)
    teacher0 = {k: v.double().clone() for k, v in task.teacher.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the student moved by one optimizer step
    run = SimpleNamespace(accelerator=Accelerator(cpu=True), model=model, extras={"head": task.head},
                          state=SimpleNamespace(step=30), total_steps=100, cfg=cfg)
    task.spread = 1.0
    task.after_step(run)
    m = teacher_momentum(30, 100, 0.996)
    assert 0.996 < m < 1.0
    student = model.state_dict()
    for k, v in task.teacher.state_dict().items():
        want = m * teacher0[k] + (1 - m) * student[k].double()
        assert torch.allclose(v.double(), want, atol=1e-6), k
    assert not torch.allclose(task.teacher.pos_embed, teacher0["pos_embed"].float())  # it did move


DINO_ARGS = ["--pretrain.method=dino", "--pretrain.out_dim=64", "--pretrain.hidden_dim=32",
             "--pretrain.bottleneck_dim=16", "--pretrain.local_crops=2", "--pretrain.koleo_weight=0.1",
             "--pretrain.ibot_weight=1", "--pretrain.mask_ratio=0.3", "--data.batch_size=16", "--run.epochs=1",
             "--data.num_workers=0", "--run.eval_every=1", "--model.depth=2", "--data.val_fraction=0.1"]


def _train(tmp_path, name, *extra):
    r = run_script("train.py", *DINO_ARGS, f"--run.output_dir={tmp_path}", f"--run.name={name}", *extra)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.mark.slow
def test_a_resumed_dino_run_equals_an_uninterrupted_one_and_saves_the_backbone_alone(tmp_path):
    import shutil

    from safetensors.torch import load_file

    few = make_image_folder(tmp_path / "few", n_train=4, n_val=3)  # the k-NN monitor's labelled images
    knn = f"--pretrain.knn_root={few}"
    _train(tmp_path, "whole", "--run.max_steps=4", "--run.save_state_every=2", knn)
    whole = tmp_path / "whole"
    split = tmp_path / "split"  # the same run stopped at step 2: its folder with the later state removed
    shutil.copytree(whole, split)
    for later in ("last", "best", "state/step-00000004"):
        shutil.rmtree(split / later)
    out = _train(tmp_path, "split", "--run.max_steps=4", "--run.save_state_every=2", "--resume=auto", knn)
    knn_rows = [r["val_knn"] for d in (whole, split) for r in csv.DictReader(open(d / "metrics.csv")) if r["val_knn"]]
    assert len(knn_rows) == 2 and knn_rows[0] == knn_rows[1] and 0 <= float(knn_rows[0]) <= 1  # scored, the same
    assert "step-00000002" in out and "starting fresh" not in out  # it did resume at step 2
    a, b = (load_file(d / "last" / "model.safetensors") for d in (whole, split))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = (load_file(sorted((d / "state").glob("step-*"))[-1] / "task_state.safetensors") for d in (whole, split))
    assert any(k.startswith("teacher.") for k in sa) and "dino_centre" in sa and "ibot_centre" in sa
    assert sa["dino_centre"].abs().sum() > 0
    assert all(torch.equal(sa[k], sb[k]) for k in sa)  # the teacher and the centres, exactly
    # the backbone alone: no head, teacher or mask token; timm builds it from config.json and loads it strict
    import timm

    c = json.loads((whole / "last" / "config.json").read_text())
    assert not [k for k in a if k.startswith(("head", "teacher", "mask"))]
    timm.create_model(c["architecture"], **c["model_args"]).load_state_dict(a, strict=True)
    # and our reader takes it (few_shot.py, features.py): a backbone without classes, from a pretrain run only
    from vit.models.checkpoint import CheckpointError, load_checkpoint

    model, cfg, classes, _ = load_checkpoint(whole / "last")
    assert classes == [] and cfg.pretrain.method == "dino" and model.num_classes == 0
    import yaml

    saved = yaml.safe_load((whole / "last" / "config.yaml").read_text())
    del saved["pretrain"]  # the same folder as a supervised run's: no classes is then an error
    (whole / "last" / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(CheckpointError, match="non-empty list of class names"):
        load_checkpoint(whole / "last")


@pytest.mark.slow
def test_a_collapsing_teacher_stops_the_run_with_one_sentence(tmp_path):
    r = run_script("train.py", "--pretrain.method=dino", "--pretrain.out_dim=64", "--pretrain.local_crops=0",
                   "--pretrain.centering=none", "--pretrain.teacher_temp=0.01", "--pretrain.warmup_teacher_temp=0.01",
                   "--pretrain.momentum=0.5", "--optim.lr=1e-2", "--optim.warmup_epochs=0", "--data.batch_size=32",
                   "--run.epochs=1", "--run.max_steps=30", "--data.num_workers=0", "--model.depth=2",
                   f"--run.output_dir={tmp_path}", "--run.name=c")
    assert r.returncode != 0
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error: the teacher's outputs collapsed at step ") and "pretrain.centering" in line
