"""Defaults from the machine (threads, loader workers, precision) and an ImageFolder without val/."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT, TINY, make_image_folder, run_script
from vit.cli.runtime import (
    apply_machine_defaults,
    make_accelerator,
    resolve_precision,
    resolve_threads,
    resolve_workers,
)
from vit.config import ConfigError, load_config
from vit.data import build_datasets, resolve_data_config


@pytest.fixture
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("cpus, gpu, workers, threads", [
    (1, False, 0, 1),  # one CPU: load in the main process
    (2, False, 1, 1),  # the digits machine: one worker beside one compute thread, no core shared
    (8, False, 2, 6),
    (64, False, 8, 56),
    (2, True, 1, 1),
    (16, True, 8, 8),
])
def test_auto_workers_and_threads_never_oversubscribe(cpus, gpu, workers, threads):
    w = resolve_workers("auto", cpus=cpus, gpu=gpu)
    t = resolve_threads("auto", w, cpus=cpus)
    assert (w, t) == (workers, threads)
    assert w + t <= max(cpus, 1)  # one thread per core: workers run one thread each
    assert resolve_workers(3, cpus=cpus, gpu=gpu) == 3 and resolve_threads(5, w, cpus=cpus) == 5  # pinned: kept


def test_auto_precision():
    assert resolve_precision("auto", gpu_bf16=True) == "bf16"
    assert resolve_precision("auto", gpu_bf16=False) == "no"
    for pinned in ("no", "bf16", "fp16", None):
        assert resolve_precision(pinned, gpu_bf16=False) == pinned


def test_auto_spellings_in_the_config():
    cfg = load_config(None, ["--data.num_workers=auto", "--run.num_threads=auto", "--run.mixed_precision=auto"])
    assert (cfg.data.num_workers, cfg.run.num_threads, cfg.run.mixed_precision) == ("auto", "auto", "auto")
    assert load_config(None, ["--data.num_workers=3"]).data.num_workers == 3
    for bad, needle in (("--data.num_workers=many", "must be a number or 'auto'"),
                        ("--data.num_workers=-1", "must not be negative"),
                        ("--run.num_threads=0", "must be positive")):
        with pytest.raises(ConfigError, match=needle):
            load_config(None, [bad])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a CPU-only machine resolves")
def test_shipped_finetune_config_resolves_for_this_cpu(keep_threads):
    """configs/finetune_imagefolder.yaml (ViT-B, meant for a GPU) runs on a CPU without overrides: no bf16, no
    more loader workers and threads than the CPUs; torch is set to the resolved thread count."""
    import os

    cpus = len(os.sched_getaffinity(0))
    cfg = apply_machine_defaults(load_config(ROOT / "configs/finetune_imagefolder.yaml"))
    assert cfg.run.mixed_precision == "no"
    assert 0 <= cfg.data.num_workers <= max(0, cpus - 1) and cfg.data.num_workers <= 8
    assert cfg.run.num_threads >= 1 and cfg.data.num_workers + cfg.run.num_threads <= max(cpus, 1)
    assert torch.get_num_threads() == cfg.run.num_threads
    assert make_accelerator(mixed_precision=cfg.run.mixed_precision).mixed_precision == "no"
    assert make_accelerator(mixed_precision="auto").mixed_precision == "no"
    pinned = apply_machine_defaults(load_config(ROOT / "configs/finetune_imagefolder.yaml",
                                                ["--data.num_workers=3", "--run.num_threads=1"]))
    assert (pinned.data.num_workers, pinned.run.num_threads, torch.get_num_threads()) == (3, 1, 1)


def _folder_without_val(tmp_path: Path, counts: dict[str, int]) -> Path:
    for c, n in counts.items():  # classes of different sizes, so a split that ignores labels shows
        make_image_folder(tmp_path / c, classes=(c,), n_train=n, n_val=0, size=12)
        (tmp_path / "f" / "train").mkdir(parents=True, exist_ok=True)
        (tmp_path / c / "train" / c).rename(tmp_path / "f" / "train" / c)
    return tmp_path / "f"


def test_imagefolder_without_val_is_split_stratified_and_seeded(tmp_path, caplog):
    # 20% of 10, 20 and 15 images are whole numbers: a stratified split holds out exactly 2, 4 and 3.
    root = _folder_without_val(tmp_path, {"ant": 10, "bee": 20, "cow": 15})
    over = ["--data.dataset=imagefolder", f"--data.root={root}", "--data.val_fraction=0.2", "--model.img_size=16"]
    cfg = resolve_data_config(load_config(None, over))
    with caplog.at_level("INFO", logger="vit.data"):
        train, val, classes = build_datasets(cfg)
    assert classes == ["ant", "bee", "cow"]
    assert Counter(val.labels) == {0: 2, 1: 4, 2: 3} and Counter(train.labels) == {0: 8, 1: 16, 2: 12}
    tr, va = {p for p, _ in train.samples}, {p for p, _ in val.samples}
    assert not tr & va and len(tr | va) == 45 and all(p.parent.parent == root / "train" for p in tr | va)
    assert "no val/ folder" in caplog.text and "9 val" in caplog.text
    assert val[0][0].shape == (3, 16, 16)
    # the same seed gives the same split (evaluate.py rebuilds it), evaluation alone builds only val
    again = build_datasets(cfg, splits=("val",), classes=classes, check_images=False)
    assert again[0] is None and again[1].samples == val.samples
    seed1 = resolve_data_config(load_config(None, over + ["--data.split_seed=1"]))
    other = build_datasets(seed1, check_images=False)[1]
    assert Counter(other.labels) == Counter(val.labels) and other.samples != val.samples


@pytest.mark.slow
def test_train_on_imagefolder_without_val(tmp_path):
    """The whole run: the log says what was held out, the 7 held-out images are scored every epoch, and the
    launcher's OMP_NUM_THREADS (accelerate launch sets 1) does not change the thread count chosen."""
    root = _folder_without_val(tmp_path, {"a": 10, "b": 15, "c": 10})
    w = resolve_workers("auto")
    r = run_script("train.py", "--data.dataset=imagefolder", f"--data.root={root}", f"--run.output_dir={tmp_path}/r",
                   "--run.epochs=1", *TINY, "--data.num_workers=auto", env={"OMP_NUM_THREADS": "7"})
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout + r.stderr
    assert "no val/ folder" in out and "28 train / 7 val" in out
    assert f"{resolve_threads('auto', w)} thread(s), {w} loader worker(s)" in out
    with open(tmp_path / "r" / "default" / "metrics.csv") as f:
        assert len(list(csv.DictReader(f))) == 1
    saved = load_config(tmp_path / "r" / "default" / "config.yaml")
    assert (saved.data.num_workers, saved.run.num_threads) == (w, resolve_threads("auto", w))


def test_ddp_grad_strides_warning_is_silenced_and_its_cause_is_the_cls_token():
    import warnings

    import vit
    from vit.cli.runtime import GRAD_STRIDES_WARNING

    # the cause: with one image, cls_token's gradient is a slice of the token gradient (size-1 dims' strides)
    model = vit.create_model("vit_tiny_patch16_224", img_size=32, embed_dim=32, depth=1, num_heads=2, num_classes=3)
    model(torch.randn(1, 3, 32, 32)).sum().backward()
    odd = [n for n, p in model.named_parameters() if p.grad.stride() != p.stride()]
    assert odd in ([], ["cls_token"]), odd  # [] once PyTorch makes such gradients contiguous
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        make_accelerator()  # every script's accelerator: PyTorch's warning from each DDP process is not shown
        warnings.warn(f"{GRAD_STRIDES_WARNING}. This may indicate grad was not created ...", UserWarning, stacklevel=1)
    assert not seen
