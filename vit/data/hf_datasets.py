"""`data.dataset: hf`: a Hugging Face `datasets` dataset saved on disk, as timm's `hfds/` reader reads one.

`data.root` is a folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk` (it holds
`dataset_dict.json` or `state.json`), or a folder of parquet files, laid out as the Hub does
(`data/train-00000-of-00004.parquet`, `train-*.parquet` or `train/*.parquet`). `data.train_split` /
`data.val_split` name the splits (the Hub's ImageNet calls its second one `validation`), `data.image_column`
and `data.label_column` the columns. Images are read as their encoded bytes (the `Image` feature with
`decode=False`) and decoded by our pipeline, as the folder dataset's files are; class names come from a
`ClassLabel` label column, else from `data.num_classes`. `datasets` is an optional extra (pip install -e '.[hf]'),
imported only here.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from .base import DataError, SeededDataset, check_classes
from .decode import BadImageError, read_bytes

__all__ = ["HFImageDataset", "build_hf_datasets", "load_split", "check_labels"]
log = logging.getLogger(__name__)


class HFImageDataset(SeededDataset):
    """Rows of a table (anything indexable giving dicts: a `datasets.Dataset`) -> (image tensor, label)."""

    def __init__(self, table, image_column: str, label_column: str, classes, transform, seed: int = 0,
                 name: str = "hf", on_bad_image: str = "skip") -> None:
        super().__init__(transform, classes, seed)
        self.table, self.image_column, self.label_column, self.name = table, image_column, label_column, name
        self.on_bad_image, self.bad = on_bad_image, []

    def __len__(self) -> int:
        return len(self.table)

    def describe(self, i: int) -> str:
        return f"{self.name}[{i}]"

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        """Row i; an undecodable image is replaced by the next good row (and logged) under
        data.on_bad_image=skip, as a folder image that went bad is, and refused under error."""
        for k in range(len(self)):
            j = (i + k) % len(self)
            try:
                return self._row(j, self.sample_seed(i))
            except BadImageError as e:
                if self.on_bad_image == "error":
                    raise DataError(f"{self.describe(j)} is not a readable image ({e}); fix the row or set "
                                    "data.on_bad_image=skip.") from None
                if f"{self.describe(j)}: {e}" not in self.bad:  # named once, however often it is asked for
                    self.bad.append(f"{self.describe(j)}: {e}")
                    log.warning("skipping %s: %s", self.describe(j), e)
        raise DataError(f"no readable image left in {self.name}.")

    def _row(self, i: int, seed: int) -> tuple[torch.Tensor, int]:
        row = self.table[i]
        value = row[self.image_column]
        path = value.get("path") if isinstance(value, dict) else None
        data = value.get("bytes") if isinstance(value, dict) else value
        if data is None and path:  # an Image column that stores paths only
            data = read_bytes(path)
        if not isinstance(data, (bytes, bytearray)):
            raise DataError(f"column '{self.image_column}' of {self.name} holds {type(value).__name__}, not encoded "
                            "images; set data.image_column to the image column.")
        return self.transform.load_bytes(bytes(data), path or self.describe(i), seed), int(row[self.label_column])


def _datasets():
    try:
        import datasets
    except ImportError:
        raise DataError("data.dataset=hf needs the Hugging Face datasets package; "
                        "pip install -e '.[hf]' (or pip install datasets).") from None
    return datasets


def load_split(root: str | Path, split: str):
    """One split of a dataset saved on disk, or of a folder of parquet files."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"data.root {root} does not exist; point it at a datasets.save_to_disk folder or a folder "
                        "of parquet files.")
    datasets = _datasets()
    if (root / "dataset_dict.json").is_file() or (root / "state.json").is_file():
        ds = datasets.load_from_disk(str(root))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise DataError(f"split '{split}' is not in {root} (it has {sorted(ds)}); set data.train_split / "
                                "data.val_split to one of those.")
            return ds[split]
        return ds  # a single Dataset (no splits): build_hf_datasets holds out data.val_fraction of it
    for pattern in (f"data/{split}-*.parquet", f"{split}-*.parquet", f"{split}/*.parquet", f"data/{split}/*.parquet"):
        files = sorted(root.glob(pattern))
        if files:
            return datasets.load_dataset("parquet", data_files=[str(f) for f in files], split="train")
    raise DataError(f"no split '{split}' in {root}: neither a save_to_disk folder (dataset_dict.json) nor parquet "
                    f"files named like data/{split}-*.parquet; set data.train_split / data.val_split.")


def _classes(table, label_column: str, num_classes: int | None) -> list[str]:
    feature = getattr(table, "features", {}).get(label_column) if hasattr(table, "features") else None
    names = getattr(feature, "names", None)
    if names:
        return list(names)
    if num_classes:
        return [str(i) for i in range(num_classes)]
    raise DataError(f"column '{label_column}' does not name its classes (not a ClassLabel); set data.num_classes.")


def check_labels(table, label_column: str, classes: list[str], where: str) -> None:
    """Refuse, before training, a label column that does not hold class indices 0..len(classes)-1: floats
    (which int() would truncate, 1.7 -> 1), strings, -1 (the Hub's "no label") or indices past the classes,
    which would otherwise stop an epoch midway with an IndexError."""
    labels = np.asarray(table[label_column])
    if not len(labels):
        return
    n = len(classes)
    if labels.dtype.kind not in "iu":
        first = next((v for v in labels.tolist() if not (isinstance(v, int) and not isinstance(v, bool))), labels[0])
        kind = "text" if isinstance(first, str) else type(first).__name__
        raise DataError(f"column '{label_column}' of {where} holds {kind} labels (first: {first!r}), not class "
                        f"indices; store integer labels 0..{n - 1} (datasets: class_encode_column('{label_column}')), "
                        "or set data.label_column to the column that holds them.")
    bad = np.flatnonzero((labels < 0) | (labels >= n))
    if len(bad):
        y = int(labels[bad[0]])
        what = " (the Hub's 'no label', as in a test split)" if y == -1 else ""
        raise DataError(f"row {int(bad[0])} of {where} has label {y}{what}, but the classes are 0..{n - 1} "
                        f"({len(bad)} row(s) like it); filter those rows out, use a split that is labelled, or set "
                        "data.num_classes to cover them.")


def _single_dataset(root) -> bool:
    """A folder written by `Dataset.save_to_disk` (one table, no split names)."""
    root = Path(root)
    return (root / "state.json").is_file() and not (root / "dataset_dict.json").is_file()


def _held_out(cfg, table, name: str):
    """A single Dataset: its train or val part, held out as an ImageFolder without val/ is (vit/data/datasets.py): the
    seeded, stratified data.val_fraction, so training never sees the rows it is validated on."""
    from sklearn.model_selection import train_test_split

    d = cfg.data
    labels = np.asarray(table[d.label_column])
    if labels.dtype.kind not in "iu" or not len(labels) or labels.min() < 0:
        raise DataError(f"{d.root} is a single Dataset (no splits), and its label column '{d.label_column}' does not "
                        "hold class indices to hold out a stratified validation share by; save a DatasetDict with "
                        "train and validation splits instead.")
    counts = np.bincount(labels)
    n_val = int(np.ceil(d.val_fraction * len(labels)))
    present = int((counts > 0).sum())
    if d.val_fraction <= 0 or counts[counts > 0].min() < 2 or n_val < present or len(labels) - n_val < present:
        raise DataError(f"{d.root} is a single Dataset (no splits), and holding out data.val_fraction={d.val_fraction}"
                        f" of its {len(labels)} rows cannot leave every class in both parts; save a DatasetDict "
                        "with a validation split, or set a data.val_fraction that does.")
    tr, va = train_test_split(np.arange(len(labels)), test_size=d.val_fraction, random_state=d.split_seed,
                              stratify=labels)
    keep = sorted(tr if name == "train" else va)
    if name == "val":  # once, not per split
        log.info("%s is a single Dataset (no splits): holding out a stratified %g of it (data.val_fraction, "
                 "data.split_seed=%d): %d train / %d val rows", d.root, d.val_fraction, d.split_seed, len(tr), len(va))
    return table.select(keep)


def build_hf_datasets(cfg, t_train, t_val, splits=("train", "val"), classes=None):
    """(train, val, class names) for `data.dataset: hf`."""
    d = cfg.data
    out, found = {}, None
    single = _single_dataset(d.root)
    for name, split, t in (("train", d.train_split, t_train), ("val", d.val_split, t_val)):
        if name not in splits:
            continue
        table = load_split(d.root, split)
        if single and d.label_column in table.column_names:
            table = _held_out(cfg, table, name)
        for col in (d.image_column, d.label_column):
            if col not in table.column_names:
                raise DataError(f"split '{split}' of {d.root} has no column '{col}' (it has {table.column_names}); "
                                "set data.image_column / data.label_column.")
        if "Image" in type(table.features[d.image_column]).__name__:  # keep the encoded bytes: our decoder reads them
            table = table.cast_column(d.image_column, _datasets().Image(decode=False))
        found = found or _classes(table, d.label_column, d.num_classes)
        out[name] = (table, t, split)
    classes = check_classes(classes, found)
    if classes != found:
        raise DataError("the dataset's classes are in another order than the checkpoint's; evaluate on data with the "
                        "classes the model was trained on.")
    for tb, _, s in out.values():
        check_labels(tb, d.label_column, classes, f"{d.root}:{s}")
    built = {k: HFImageDataset(tb, d.image_column, d.label_column, classes, t, cfg.run.seed, f"{d.root}:{s}",
                               d.on_bad_image) for k, (tb, t, s) in out.items()}
    return built.get("train"), built.get("val"), classes
