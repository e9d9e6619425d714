"""Class imbalance: data.sampler=balanced (class-weighted draws, exact epochs) and optim.class_weights=auto."""

from __future__ import annotations

import contextlib
import csv
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import import_script, run_script
from PIL import Image

from vit.config import ConfigError, load_config
from vit.data import EpochSampler, build_loaders, class_weights
from vit.data.synthetic import long_tailed_colours

COUNTS = [120, 40, 12, 6]  # a long tail: 20 to 1
SMALL = ["--model.img_size=32", "--model.patch_size=16", "--model.embed_dim=32", "--model.depth=1",
         "--model.num_heads=2", "--model.mlp_ratio=2", "--data.batch_size=16", "--aug.random_resized_crop=false",
         "--aug.hflip=0", "--data.num_workers=0", "--optim.warmup_epochs=1", "--optim.lr=3e-3", "--run.eval_every=6",
         "--aug.label_smoothing=0"]


def write_long_tailed(root: Path, train=COUNTS, val=(12, 12, 12, 12), seed=0) -> Path:
    rng = np.random.default_rng(seed)
    for split, counts in (("train", train), ("val", val)):
        imgs, labels = long_tailed_colours(rng, list(counts))
        for i, (img, y) in enumerate(zip(imgs, labels)):
            d = root / split / f"c{y}"
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img).save(d / f"{i:04d}.png")
    return root


class Labelled(torch.utils.data.Dataset):
    def __init__(self, labels, k):
        self.labels, self.classes = labels, [str(i) for i in range(k)]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return torch.zeros(1), self.labels[i]


def test_balanced_sampler_draws_classes_equally_in_epochs_of_the_same_length():
    labels = np.repeat(np.arange(4), COUNTS).tolist()
    cfg = load_config(None, {"data.sampler": "balanced", "data.num_workers": 0, "data.batch_size": 8})
    loader, _ = build_loaders(cfg, Labelled(labels, 4), Labelled(labels, 4))
    s = loader.sampler
    order = list(s)
    assert len(order) == len(s) == len(labels) == len(loader.dataset)  # exact epochs: as many draws as images
    drawn = np.bincount(np.asarray(labels)[order], minlength=4)
    assert drawn.min() > 0.6 * len(labels) / 4  # each class ~a quarter (shuffle gives the last class 3%)
    fresh = EpochSampler(len(labels), seed=cfg.run.seed, weights=s.weights)  # a resumed process rebuilds it
    assert list(fresh) == order  # a function of (seed, epoch) only: skipping the seen batches resumes exactly
    s.set_epoch(1)
    fresh.set_epoch(1)
    assert list(s) == list(fresh) != order
    plain, _ = build_loaders(load_config(None, {"data.num_workers": 0}), Labelled(labels, 4), Labelled(labels, 4))
    assert sorted(plain.sampler) == list(range(len(labels)))  # the default: each image once


def test_auto_class_weights_are_inverse_frequency_and_weigh_the_loss_as_cross_entropy():
    labels = np.repeat(np.arange(4), COUNTS).tolist()
    w = class_weights(load_config(None, {"optim.class_weights": "auto"}), Labelled(labels, 4))
    n = sum(COUNTS)
    torch.testing.assert_close(w, torch.tensor([n / (4 * c) for c in COUNTS]))
    assert class_weights(load_config(None), Labelled(labels, 4)) is None

    from vit.train.tasks import ClassificationTask  # the loss the loop uses (without DSA's indexer KL), no run

    torch.manual_seed(0)
    logits, y = torch.randn(10, 4), torch.randint(0, 4, (10,))
    model = lambda x: logits  # noqa: E731
    acc = SimpleNamespace(autocast=contextlib.nullcontext)
    cfg = load_config(None, {"aug.label_smoothing": 0.0})
    run = SimpleNamespace(model=model, accelerator=acc)
    task = ClassificationTask(cfg, list("abcd"), class_weights=w)
    torch.testing.assert_close(task.loss(run, None, y), F.cross_entropy(logits, y, weight=w))
    # soft (mixed) targets that are one-hot give the same value: mixing keeps the weights' meaning
    task.mixup = lambda x, t: (x, F.one_hot(t, 4).float())
    torch.testing.assert_close(task.loss(run, torch.zeros(10, 1), y), F.cross_entropy(logits, y, weight=w))


@pytest.mark.parametrize("key, value", [("data.sampler", "balanced"), ("optim.class_weights", "auto")])
def test_balancing_is_refused_where_it_cannot_apply(key, value):
    with pytest.raises(ConfigError, match=f"'{key}' balances single-label classes"):
        load_config(None, {key: value, "data.dataset": "imagefolder", "data.root": "x", "data.labels_file": "l.csv"})
    with pytest.raises(ConfigError, match=f"'{key}' needs every training label"):
        load_config(None, {key: value, "data.dataset": "wds", "data.root": "x"})
    with pytest.raises(ConfigError, match="must be one of"):
        load_config(None, {key: "sometimes"})


@pytest.mark.slow
def test_balancing_raises_the_rare_classes_recall_on_a_long_tailed_set(tmp_path):
    """Trained on 120/40/12/6 images of overlapping classes, scored on 12 of each by evaluate.py's per-class
    table: balancing raises the macro recall and the rarest class's recall (figures in the module's note)."""
    data = write_long_tailed(tmp_path / "d")
    common = ["--data.dataset=imagefolder", f"--data.root={data}", f"--run.output_dir={tmp_path}", "--run.epochs=12",
              *SMALL]
    evaluate = import_script("evaluate")
    recall = {}
    for name, extra in (("plain", []), ("balanced", ["--data.sampler=balanced"]),
                        ("weighted", ["--optim.class_weights=auto"])):
        r = run_script("train.py", *common, f"--run.name={name}", *extra)
        assert r.returncode == 0, r.stderr
        out = tmp_path / f"ev-{name}"
        assert evaluate.main(["--checkpoint", str(tmp_path / name / "last"), "--out", str(out)]) == 0
        rows = list(csv.DictReader(open(out / "per_class.csv")))
        recall[name] = [float(r["recall"]) for r in rows]
    print({k: [round(v, 2) for v in r] for k, r in recall.items()})
    for name in ("balanced", "weighted"):
        assert recall[name][3] > recall["plain"][3]
        assert np.mean(recall[name]) >= np.mean(recall["plain"])
