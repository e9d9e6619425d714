"""Labelling sentences with a text classifier (predict.py on a text checkpoint): the sentences of text files (one
a line) or CSVs (a column), tokenised with the checkpoint's tokenizer, in batches padded to their longest row.
"""

from __future__ import annotations

import csv
from pathlib import Path

import torch

from ..data.base import DataError

__all__ = ["predict_texts", "read_texts"]


def read_texts(inputs: list[str], column: str = "text") -> tuple[list[str], list[str]]:
    """(sentences, where each came from as 'file:line') from text files (each non-blank line a sentence) and CSV
    files (their `column`, a header row first)."""
    texts, where = [], []
    for name in inputs:
        path = Path(name)
        if not path.is_file():
            raise DataError(f"{path} is not a file; pass text files (one sentence a line) or CSVs with a "
                            f"{column!r} column.")
        with open(path, newline="", encoding="utf-8") as f:
            if path.suffix.lower() == ".csv":
                reader = csv.DictReader(f)
                if column not in (reader.fieldnames or []):
                    raise DataError(f"{path} has no column {column!r} (its columns: "
                                    f"{', '.join(reader.fieldnames or []) or 'none'}); name a file with one.")
                rows = [(i + 2, r[column] or "") for i, r in enumerate(reader)]  # line 1 is the header
            else:
                rows = [(i + 1, line.rstrip("\r\n")) for i, line in enumerate(f) if line.strip()]
        texts += [t for _, t in rows]
        where += [f"{path}:{n}" for n, _ in rows]
    return texts, where


@torch.no_grad()
def predict_texts(model: torch.nn.Module, tokenizer, texts: list[str], batch_size: int = 32,
                  max_length: int = 512) -> torch.Tensor:
    """Logits (N, C) of `texts` in order: `model` a text classifier (vit.create_text_model(name, num_classes=N)),
    `tokenizer` its own (vit.load_tokenizer); texts truncated at the tokenizer's model_max_length, else
    `max_length`."""
    model.eval()
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(texts[start:start + batch_size], padding=True, truncation=True,
                          max_length=tokenizer.model_max_length or max_length, return_tensors="pt")
        out.append(model(**{k: v.to(device) for k, v in batch.items()}).float().cpu())
    return torch.cat(out) if out else torch.zeros(0, getattr(model, "num_classes", 0))
