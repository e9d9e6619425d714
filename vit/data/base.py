"""What every dataset of `vit.data` shares: the error it raises, the per-sample seeding of augmentation, and
the ImageFolder conventions (which folders are classes, which files are images, that every split has the same
classes). The folder, shard and Hugging Face readers all take them from here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from torch.utils.data import Dataset

from .decode import IMG_EXTENSIONS

__all__ = ["DataError", "IMG_EXTENSIONS", "SeededDataset", "class_folders", "image_files", "folder_classes",
           "check_classes"]


class DataError(ValueError):
    """A dataset that cannot be used as given; the message says what to do."""


class SeededDataset(Dataset):
    """Shared part: a transform seeded per (seed, epoch, index)."""

    def __init__(self, transform, classes: Sequence[str], seed: int) -> None:
        self.transform, self.classes, self.seed, self.epoch = transform, list(classes), seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def sample_seed(self, index: int) -> int:
        return (self.seed * 1_000_003 + self.epoch * 10_007 + index) % (2**31)


def class_folders(d: Path) -> list[str]:
    """Class folder names, hidden ones (.ipynb_checkpoints, .git) left out."""
    names = sorted(p.name for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
    for name in names:  # a class name is saved as UTF-8 text (classes.json, config.json) and must come back
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise DataError(f"class folder {os.fsencode(name)!r} in {d} has a name that is not UTF-8 text, so the "
                            "model's class names could not be saved and read back; rename the folder.") from None
    return names


def image_files(d: Path):
    """Files under `d` with an image extension, none inside a hidden folder or hidden itself (._x.jpg)."""
    return (p for p in d.rglob("*") if p.suffix.lower() in IMG_EXTENSIONS
            and not any(part.startswith(".") for part in p.relative_to(d).parts))


def folder_classes(root: Path, split: str) -> list[str]:
    d = root / split
    if not d.is_dir():
        raise DataError(f"ImageFolder split folder {d} does not exist; expected {root}/train/<class>/ and "
                        f"{root}/val/<class>/.")
    classes = class_folders(d)
    if not classes:
        raise DataError(f"{d} has no class folders; put images in {d}/<class_name>/.")
    for c in classes:
        if next(image_files(d / c), None) is None:
            raise DataError(f"class folder {d / c} holds no images; add images or remove the folder.")
    return classes


def check_classes(expected: list[str] | None, found: list[str]) -> list[str]:
    if expected is None:
        return found
    extra = [c for c in found if c not in expected]
    if extra or len(found) > len(expected):
        missing = [c for c in expected if c not in found]
        raise DataError(
            f"the dataset's classes differ from the checkpoint's: not in the checkpoint: {extra[:5]}"
            + (f", not in the dataset: {missing[:5]}" if missing else "")
            + "; evaluate on data with the classes the model was trained on."
        )
    return list(expected)
