"""Text classification data: a CSV of sentences and labels (`data.dataset: text_csv`), tokenised once with the
tokenizer of the weights being fine-tuned (`model.pretrained`, vit.load_tokenizer), padded per batch.

    text,label                     data.text_column / data.label_column name the columns (default text, label);
    "a great film",pos             labels are class names (sorted; whole numbers sort as numbers); a `split`
    "dull and long",neg            column (train / val / test) chooses the rows of each split, else a
                                   stratified data.val_fraction of them is held out, seeded by data.split_seed

A batch is (input_ids (B, N) padded with the tokenizer's pad id to its longest row, labels (B,)): the text
classifier masks the pad id (vit.models.text_classifier), so the training loop passes ids as it passes images.
Texts longer than the tokenizer's model_max_length (512 when it sets none) are truncated.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..config import Config
from .base import DataError, check_classes

__all__ = ["TextDataset", "build_text_datasets", "read_text_csv"]

DEFAULT_MAX_TOKENS = 512  # BERT's positions: the truncation length when the tokenizer names none


class TextDataset(Dataset):
    """Token ids and labels in memory; `collate` pads a batch with `pad_id` (the DataLoader's collate_fn)."""

    def __init__(self, ids: list[list[int]], labels: list[int], classes: list[str], pad_id: int,
                 texts: list[str]) -> None:
        self.ids, self.labels, self.classes, self.pad_id, self.texts = ids, labels, classes, pad_id, texts

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.tensor(self.ids[i], dtype=torch.long), self.labels[i]

    def describe(self, i: int) -> str:
        return self.texts[i]

    def collate(self, batch: list[tuple]) -> tuple[torch.Tensor, ...]:
        """[(ids, label[, index]), ...] -> (input_ids (B, N) padded with pad_id, labels (B,)[, indices (B,)])."""
        n = max(len(item[0]) for item in batch)
        x = torch.full((len(batch), n), self.pad_id, dtype=torch.long)  # (B, N)
        for row, item in enumerate(batch):
            x[row, : len(item[0])] = item[0]
        return (x, *(torch.tensor(column, dtype=torch.long) for column in list(zip(*batch))[1:]))


def _sort_key(name: str):
    return (0, int(name), "") if name.lstrip("-").isdigit() else (1, 0, name)


def read_text_csv(path: str | Path, text_column: str = "text", label_column: str = "label"
                  ) -> tuple[list[str], list[str], list[str]]:
    """(texts, labels as written, split column or '' per row) from a CSV with a header row."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data.root {path} is not a file; point it at a CSV with a header row and the columns "
                        f"{text_column!r} and {label_column!r}.")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    header = list(rows[0]) if rows else []
    for column, key in ((text_column, "text_column"), (label_column, "label_column")):
        if column not in header:
            raise DataError(f"{path} has no column {column!r} (its columns: {', '.join(header) or 'none'}); name "
                            f"the right one with data.{key}.")
    bad = next((i for i, r in enumerate(rows) if not (r[label_column] or "").strip() or r[text_column] is None), None)
    if bad is not None:
        raise DataError(f"{path}: row {bad + 2} has no {label_column!r} or {text_column!r}; fill it in or remove it.")
    return ([r[text_column] for r in rows], [r[label_column].strip() for r in rows],
            [(r.get("split") or "").strip() for r in rows])


def build_text_datasets(cfg: Config, splits: tuple[str, ...] = ("train", "val"), classes: list[str] | None = None,
                        tokenizer=None):
    """(train, val, class names) for `data.dataset: text_csv` (the module docstring); a split left out of `splits`
    comes back as None, and a third name in `splits` (evaluate.py's `test`: the split column's rows) comes back
    as val. `classes` (a checkpoint's) fixes the label order. `tokenizer`: default model.pretrained's."""
    from ..hub.tokenizer import load_tokenizer

    d = cfg.data
    texts, names, split = read_text_csv(d.root, d.text_column, d.label_column)
    classes = check_classes(classes, sorted(set(names), key=_sort_key))
    labels = np.array([classes.index(n) for n in names])
    if any(split):
        unknown = sorted({s for s in split if s not in ("train", "val", "test")})
        if unknown:
            raise DataError(f"{d.root}: the split column holds {unknown[0]!r}; use train, val or test.")
        parts = {s: np.flatnonzero(np.array(split) == s) for s in ("train", "val", "test")}
    else:  # the digits' and an ImageFolder's seeded, stratified hold-out
        from sklearn.model_selection import train_test_split

        idx = np.arange(len(texts))
        try:
            tr, va = train_test_split(idx, test_size=d.val_fraction, random_state=d.split_seed, stratify=labels)
        except ValueError as e:
            raise DataError(f"{d.root}: cannot hold out data.val_fraction={d.val_fraction} of {len(texts)} rows with "
                            f"every class in both parts ({e}); add rows, change val_fraction or add a split "
                            "column.") from None
        parts = {"train": np.sort(tr), "val": np.sort(va)}
    other = [s for s in splits if s not in ("train", "val")]
    if other and other[0] not in parts:
        raise DataError(f"{d.root} has no {other[0]} split (only a split column names one); score train or val.")
    want = ("train", other[0]) if other else ("train", "val")
    tok = tokenizer or load_tokenizer(cfg.model.pretrained)
    if tok.pad_token_id is None:
        raise DataError(f"the tokenizer of {cfg.model.pretrained} has no padding token; a text classifier's batches "
                        "need one (set pad_token in its tokenizer_config.json).")
    max_length = tok.model_max_length or DEFAULT_MAX_TOKENS
    out = []
    for s in want:
        if s not in splits:
            out.append(None)
            continue
        rows = parts[s]
        if not len(rows):
            raise DataError(f"{d.root} has no {s} rows; add some (split column) or remove the split column.")
        ids = tok([texts[i] for i in rows], truncation=True, max_length=max_length)["input_ids"]
        out.append(TextDataset(ids, labels[rows].tolist(), classes, tok.pad_token_id, [texts[i] for i in rows]))
    return out[0], out[1], classes
