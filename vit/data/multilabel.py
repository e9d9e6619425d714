"""Multi-label data: images listed in a labels file (data.labels_file), each with any number of labels.

Hugging Face calls the task problem_type="multi_label_classification": one sigmoid per class, a multi-hot
target. The file is one of
  CSV   a header with `image` and `labels` columns (labels separated by spaces, ';' or '|'; empty: none),
        and optionally `split` (train / val / test);
  JSON  {"path": ["label", ...], ...}, or a list of {"image": path, "labels": [...], "split": ...} objects.
Paths are relative to data.root and must stay inside it. Without a split column a seeded data.val_fraction of
the images is held out (data.split_seed), as for a folder without val/. Classes are the sorted labels of the
training rows. Each sample is (image tensor, multi-hot float (C,)).
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import torch

from .base import IMG_EXTENSIONS, DataError, SeededDataset

__all__ = ["read_labels_file", "MultiLabelDataset", "build_multilabel_datasets", "MAX_LABELS_FILE_BYTES"]

MAX_LABELS_FILE_BYTES = 256 * 2**20
_SEP = re.compile(r"[\s;|]+")


def _fail(path: Path, what: str) -> DataError:
    return DataError(f"labels file {path}: {what}.")


def read_labels_file(path: str | Path, root: str | Path) -> list[tuple[Path, list[str], str | None]]:
    """[(image path, labels, split or None)] from a CSV or JSON labels file; one sentence (DataError) for a
    file that cannot be used: missing, too large, malformed, a path outside `root` or missing, a bad label."""
    path, root = Path(path), Path(root)
    if not path.is_file():
        raise DataError(f"data.labels_file {path} does not exist; pass a CSV (image,labels) or JSON "
                        "({image: [labels]}) file.")
    if path.stat().st_size > MAX_LABELS_FILE_BYTES:
        raise _fail(path, f"is over {MAX_LABELS_FILE_BYTES >> 20} MiB; it should list paths and labels only")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise _fail(path, "is not UTF-8 text; save it as UTF-8") from None
    rows = _json_rows(path, text) if path.suffix.lower() == ".json" else _csv_rows(path, text)
    if not rows:
        raise _fail(path, "lists no images; add rows of image path and labels")
    out, seen, top = [], set(), root.resolve()
    for i, (image, labels, split) in enumerate(rows):
        where = f"entry {i + 1} ({image!r})"
        if not isinstance(image, str) or not image:
            raise _fail(path, f"entry {i + 1} has no image path")
        if not isinstance(labels, list) or not all(isinstance(x, str) and x.strip() for x in labels):
            raise _fail(path, f"{where} must give its labels as a list of names")
        if split not in (None, "train", "val", "test"):
            raise _fail(path, f"{where} has split {split!r}; use train, val or test")
        full = (root / image).resolve()
        if not full.is_relative_to(top):
            raise _fail(path, f"{where} points outside data.root {root}; give paths inside it")
        if not full.is_file() or full.suffix.lower() not in IMG_EXTENSIONS:
            raise _fail(path, f"{where} is not an image file in data.root {root}")
        if full in seen:
            raise _fail(path, f"{where} is listed twice; list each image once")
        seen.add(full)
        out.append((full, sorted({x.strip() for x in labels}), split))
    return out


def _csv_rows(path: Path, text: str) -> list:
    reader = csv.DictReader(text.splitlines())
    fields = reader.fieldnames or []
    if "image" not in fields or "labels" not in fields:
        raise _fail(path, f"needs a header with 'image' and 'labels' columns, got {fields}")
    rows = []
    for r in reader:
        if None in r or any(v is None for v in r.values()):
            raise _fail(path, f"row {reader.line_num} does not have one value per column")
        labels = [x for x in _SEP.split(r["labels"].strip()) if x]
        rows.append((r["image"].strip(), labels, (r.get("split") or "").strip() or None))
    return rows


def _json_rows(path: Path, text: str) -> list:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise _fail(path, f"is not valid JSON ({e.msg} at line {e.lineno})") from None
    if isinstance(data, dict):
        return [(k, v, None) for k, v in data.items()]
    if isinstance(data, list) and all(isinstance(r, dict) for r in data):
        return [(r.get("image"), r.get("labels"), r.get("split")) for r in data]
    raise _fail(path, "must hold {image: [labels]} or a list of {image, labels[, split]} objects")


class MultiLabelDataset(SeededDataset):
    """Images with multi-hot targets; augmentation seeded per (seed, epoch, index) as the other datasets."""

    def __init__(self, samples: list[tuple[Path, list[str]]], classes: list[str], transform, seed: int = 0) -> None:
        super().__init__(transform, classes, seed)
        index = {c: i for i, c in enumerate(self.classes)}
        self.samples = [(p, [index[x] for x in labels]) for p, labels in samples]
        self.bad: list[str] = []

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def targets(self) -> torch.Tensor:
        """Multi-hot (N, C) float targets of every sample."""
        t = torch.zeros(len(self.samples), len(self.classes))
        for i, (_, ys) in enumerate(self.samples):
            t[i, ys] = 1.0
        return t

    def describe(self, i: int) -> str:
        return str(self.samples[i][0])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        path, ys = self.samples[i]
        target = torch.zeros(len(self.classes))
        target[ys] = 1.0
        return self.transform.load(path, self.sample_seed(i)), target


def build_multilabel_datasets(cfg, t_train, t_val, splits: tuple[str, ...], classes: list[str] | None = None):
    """(train, val, classes) from data.labels_file; `classes` (a checkpoint's) fixes the label order, and a
    label it does not know is refused. The held-out split: the file's `split` column, else data.val_fraction."""
    d = cfg.data
    rows = read_labels_file(d.labels_file, d.root)
    has_split = any(s is not None for _, _, s in rows)
    if has_split:
        parts = {s: [(p, y) for p, y, sp in rows if sp == s] for s in ("train", "val", "test")}
    else:
        order = np.random.default_rng(d.split_seed).permutation(len(rows))
        n_val = int(np.ceil(d.val_fraction * len(rows)))
        if not 0 < n_val < len(rows):
            raise DataError(f"holding out data.val_fraction={d.val_fraction} of the {len(rows)} images in "
                            f"{d.labels_file} leaves a split empty; add images or a split column, or change it.")
        val = set(order[:n_val].tolist())
        parts = {"train": [(p, y) for i, (p, y, _) in enumerate(rows) if i not in val],
                 "val": [(p, y) for i, (p, y, _) in enumerate(rows) if i in val], "test": []}
    found = sorted({x for _, ys in parts["train"] or [r[:2] for r in rows] for x in ys})
    if classes is None:
        classes = found
    known = set(classes)
    for split in splits:
        if split not in parts or not parts[split]:
            raise DataError(f"{d.labels_file} has no {split} images" + (" (its split column names none)"
                            if has_split else "") + "; add some, or choose another split.")
        extra = sorted({x for _, ys in parts[split] for x in ys} - known)
        if extra:
            raise DataError(f"{d.labels_file} has labels the model does not know in its {split} images: {extra[:5]}; "
                            "evaluate on data with the classes the model was trained on.")
    if len(classes) < 2:
        raise DataError(f"{d.labels_file} names {len(classes)} label(s); multi-label classification needs at least 2.")
    seed = cfg.run.seed
    out = {s: MultiLabelDataset(parts[s], classes, t_train if s == "train" else t_val, seed) for s in splits}
    return out.get("train"), out.get("val") or out.get("test"), list(classes)
