"""Image-caption pairs for contrastive training (`data.dataset: captions`), the captions tokenised once.

    contrastive.captions_file: pairs.csv         image,caption[,split]     image paths relative to data.root; a
                                                 cat/1.jpg,a sleeping cat  `split` column (train / val) chooses
                                                 ...                       the rows of each split, else a seeded
                                                                           data.val_fraction is held out
    contrastive.captions_file: pairs.json        [{"image": "cat/1.jpg", "caption": "a sleeping cat"}, ...]
    contrastive.captions_file: null              data.root is an image folder (train/ [val/], or class
                                                 subfolders) and each image's caption is contrastive.template
                                                 with its class name ("a photo of a {}.")

A sample is (image (3, S, S), ids (context_length,)): the caption's ids as the text tower reads them (a
vit.hub.ClipTokenizer: the training captions' own words for a model trained from scratch, `word_tokenizer`, or
the pretrained model's tokenizer). `caption_index[i]` names sample i's caption among `captions`, so that
evaluation can tell which captions are the same.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..config import Config
from ..utils.files import read_regular_file
from .base import DataError

__all__ = ["CaptionDataset", "caption_datasets", "check_cut", "pair_samples", "read_pairs"]

MAX_PAIRS_BYTES = 512 * 2**20  # a captions file read at most
log = logging.getLogger(__name__)


class CaptionDataset(Dataset):
    """(image, caption ids) pairs: `images` gives (image, caption index) (a vit.data.datasets.FolderDataset, its
    label the index of its caption), `ids` (C, context_length) the tokenised `captions`."""

    def __init__(self, images: Dataset, captions: list[str], ids: torch.Tensor, classes: list[str]) -> None:
        self.images, self.captions, self.ids, self.classes = images, captions, ids, classes

    def __len__(self) -> int:
        return len(self.images)

    @property
    def caption_index(self) -> list[int]:
        return [k for _, k in self.images.samples]

    @property
    def bad(self) -> list[str]:
        return self.images.bad

    def set_epoch(self, epoch: int) -> None:  # augmentation seeded per (seed, epoch, index)
        self.images.set_epoch(epoch)

    def describe(self, i: int) -> str:
        path, k = self.images.samples[i]
        return f"{path}: {self.captions[k]}"

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, k = self.images[i]
        return image, self.ids[k]


def read_pairs(path: str | Path, root: str | Path) -> tuple[list[Path], list[str], list[str]]:
    """(image paths under `root`, captions, split per row or '') from a CSV with the columns image and caption
    (and optionally split), or a JSON list of {"image": ..., "caption": ...[, "split": ...]} objects."""
    path, root = Path(path), Path(root)
    if not path.is_absolute() and not path.is_file():
        path = root / path
    if not path.is_file():
        raise DataError(f"contrastive.captions_file {path} is not a file; name a CSV (image,caption) or JSON list of "
                        "image-caption pairs, relative to data.root or absolute.")
    try:
        text = read_regular_file(path, MAX_PAIRS_BYTES, "contrastive.captions_file").decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(f"{path} is not UTF-8 text; save it as UTF-8.") from None
    if path.suffix.lower() == ".json":
        try:
            rows = json.loads(text)
        except (ValueError, RecursionError) as e:  # RecursionError: lists nested beyond Python's stack
            raise DataError(f"{path} is not valid JSON ({e}); write a list of {{\"image\": ..., \"caption\": ...}} "
                            "objects.") from None
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise DataError(f"{path} must hold a list of {{\"image\": ..., \"caption\": ...}} objects.")
    else:
        try:  # a quoted line break stays in its caption; strict: a quote left open would swallow every row after
            rows = list(csv.DictReader(io.StringIO(text, newline=""), strict=True))
        except csv.Error as e:
            raise DataError(f"{path} is not a CSV file this reader can split ({e}); close each quoted caption "
                            f"and keep captions under {csv.field_size_limit()} characters.") from None
        header = list(rows[0]) if rows else []
        if "image" not in header or "caption" not in header:
            raise DataError(f"{path} needs a header row with the columns image and caption (its columns: "
                            f"{', '.join(header) or 'none'}).")
    if not rows:
        raise DataError(f"{path} holds no image-caption pairs; add some.")
    for i, r in enumerate(rows):
        where = f"row {i + 2}" if path.suffix.lower() != ".json" else f"item {i}"
        if not isinstance(r.get("image"), str) or not r["image"].strip() or not isinstance(r.get("caption"), str) \
                or not r["caption"].strip():
            raise DataError(f"{path}: {where} has no image path or no caption; fill it in or remove it.")
    images = [root / r["image"].strip() for r in rows]
    missing = next((p for p in images if not p.is_file()), None)
    if missing is not None:
        raise DataError(f"{path} names {missing}, which does not exist; image paths are relative to data.root "
                        f"({root}).")
    return images, [r["caption"].strip() for r in rows], [str(r.get("split") or "").strip() for r in rows]


def pair_samples(cfg: Config) -> tuple[dict[str, list[tuple[Path, int]]], list[str]]:
    """({split: [(image path, caption index)]} for train and val, the distinct captions sorted) of
    contrastive.captions_file (the module docstring)."""
    d = cfg.data
    images, texts, split = read_pairs(cfg.contrastive.captions_file, d.root)
    captions = sorted(set(texts))
    index = {c: k for k, c in enumerate(captions)}
    if any(split):
        unknown = sorted({s for s in split if s not in ("train", "val")})
        if unknown:
            raise DataError(f"{cfg.contrastive.captions_file}: the split column holds {unknown[0]!r}; use train or "
                            "val.")
        parts = {s: [i for i, t in enumerate(split) if t == s] for s in ("train", "val")}
    else:  # a seeded share of the pairs, as the digits' hold-out
        order = np.random.default_rng(d.split_seed).permutation(len(images))
        n_val = int(np.ceil(d.val_fraction * len(images)))
        parts = {"train": sorted(order[n_val:].tolist()), "val": sorted(order[:n_val].tolist())}
    for s, rows in parts.items():
        if not rows:
            raise DataError(f"{cfg.contrastive.captions_file} leaves no {s} pairs (data.val_fraction="
                            f"{d.val_fraction}, or its split column); add pairs or change the split.")
    return {s: [(images[i], index[texts[i]]) for i in rows] for s, rows in parts.items()}, captions


def caption_datasets(cfg: Config, parts: dict, captions: list[str], classes: list[str], tokenizer=None):
    """(train, val, classes) for `data.dataset: captions`: `parts` {'train', 'val'} image datasets giving (image,
    caption index) wrapped as CaptionDatasets sharing `captions` and one tokenizer (`tokenizer`, else
    contrastive.pretrained's own, else `word_tokenizer` over the training captions, contrastive.context_length
    long; it is `train.tokenizer`); classes: the class folders' names, [] for a captions file."""
    from ..hub.clip_tokenizer import repo_clip_tokenizer, word_tokenizer

    c = cfg.contrastive
    if tokenizer is None and c.pretrained:  # the model's own: its vocabulary and context
        tokenizer = repo_clip_tokenizer(c.pretrained)
        if tokenizer is None:
            raise DataError(f"contrastive.pretrained {c.pretrained} has no tokenizer.json to tokenise the captions "
                            "with; add its tokenizer to the folder or train from scratch (no contrastive.pretrained).")
    used = sorted({captions[k] for _, k in parts["train"].samples})
    tokenizer = tokenizer or word_tokenizer(used, c.context_length)
    ids = tokenizer(captions)  # (C, context_length)
    check_cut(captions, tokenizer.lengths(captions), ids)
    out = [CaptionDataset(parts[s], captions, ids, classes) for s in ("train", "val")]
    out[0].tokenizer = out[1].tokenizer = tokenizer
    return out[0], out[1], classes


def check_cut(captions: list[str], lengths: list[int], ids: torch.Tensor) -> None:
    """Say how many captions the context cuts (a warning), and refuse when the cut makes distinct captions the
    same ids: contrastive training would then score them as one caption (100% retrieval over fewer captions than
    there are). `lengths`: the ids each caption needs uncut; `ids`: (C, context_length) as the tower reads them."""
    n = ids.shape[1]
    cut = [i for i, k in enumerate(lengths) if k > n]
    if not cut:
        return
    first: dict[tuple[int, ...], int] = {}
    for i, row in enumerate(ids.tolist()):
        j = first.setdefault(tuple(row), i)
        if j != i:
            raise DataError(f"contrastive.context_length={n} cuts distinct captions to the same tokens "
                            f"({captions[j]!r} and {captions[i]!r}); raise contrastive.context_length to "
                            f"{max(lengths)} (the longest caption's) or shorten the captions.")
    log.warning("contrastive.context_length=%d cuts %d of %d captions (the longest needs %d tokens), e.g. %r; "
                "raise it to keep them whole.", n, len(cut), len(captions), max(lengths), captions[cut[0]])
