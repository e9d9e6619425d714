"""Where segmentation pairs come from: the folder layout (`<root>/images/<stem>.<ext>` beside `<root>/masks/<stem>.png`)
or a CSV with the columns `image,mask` (paths relative to the CSV's folder; an empty mask cell is a mask-less image),
and which of them a split is (`split_source`: `<root>/<split>/` or `<root>/<split>.csv`).

An image without a mask is refused unless `missing="background"` (good parts: all background). A mask that would
otherwise be passed over is refused in one sentence naming it (`DataError`): one saved as another image type, or
in the folder layout one named after no image. Masks are PNG only: a lossy format changes class values.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from .base import DataError
from .decode import IMG_EXTENSIONS

__all__ = ["SegPair", "find_pairs", "split_source"]

PNG_ONLY = "(an index or palette PNG: masks are read as PNG only, since a lossy format changes class values)"


@dataclass(frozen=True)
class SegPair:
    """One sample: an image file and its mask file (None: no mask, all background when that is allowed)."""
    image: Path
    mask: Path | None


def _folder_pairs(root: Path, missing: str) -> list[SegPair]:
    images, masks = root / "images", root / "masks"
    for d in (images, masks):
        if not d.is_dir() and not (d == masks and missing == "background"):
            raise DataError(f"{d} does not exist; the folder layout is {root}/images/<stem>.<ext> with "
                            f"{root}/masks/<stem>.png.")
    files = sorted(q for q in images.iterdir() if q.suffix.lower() in IMG_EXTENSIONS)  # listed once
    found = _mask_files(masks, {q.stem for q in files})
    pairs = []
    for p in files:
        m = found.get(p.stem)
        if m is None and missing != "background":
            raise DataError(f"image {p} has no mask {masks / (p.stem + '.png')}; add it, or set "
                            "seg.missing_masks=background to read a mask-less image as all background (good parts).")
        pairs.append(SegPair(p, m))
    if not pairs:
        raise DataError(f"{images} holds no images.")
    return pairs


def _mask_files(masks: Path, stems: set[str]) -> dict[str, Path]:
    """{stem: masks/<stem>.png}. A mask saved as another image type, or one whose stem no image has, is refused: it
    would otherwise be passed over and its image read as all background."""
    found = {}
    for m in sorted(masks.iterdir()) if masks.is_dir() else ():
        if m.name.startswith(".") or m.suffix.lower() not in IMG_EXTENSIONS:
            continue
        if m.suffix.lower() != ".png":
            raise DataError(f"mask {m} is not a PNG; save it as {m.with_suffix('.png').name} {PNG_ONLY}.")
        if m.stem not in stems:
            raise DataError(f"mask {m} has no image {m.parent.parent / 'images'}/{m.stem}.<ext>; a mask is named "
                            "after its image's stem: rename it or remove it.")
        found[m.stem] = m
    return found


def _csv_pairs(path: Path, missing: str) -> list[SegPair]:
    if not path.is_file():
        raise DataError(f"pairs file {path} does not exist; give a CSV with the columns image,mask.")
    with open(path, newline="", encoding="utf-8-sig") as f:  # utf-8-sig: a spreadsheet's byte-order mark dropped
        reader = csv.DictReader(f)
        reader.fieldnames = [(n or "").strip().lower() for n in reader.fieldnames or []]  # " Mask" is mask
        rows = list(reader)
    if not rows or not {"image", "mask"} <= set(rows[0]):
        raise DataError(f"pairs file {path} needs a header with the columns image,mask and at least one row.")
    pairs = []
    for i, row in enumerate(rows, start=2):
        image = path.parent / (row["image"] or "").strip()
        mask = path.parent / row["mask"].strip() if (row["mask"] or "").strip() else None
        if not image.is_file():
            raise DataError(f"{path} line {i}: image {image} does not exist.")
        if mask is not None and not mask.is_file():
            raise DataError(f"{path} line {i}: mask {mask} does not exist.")
        if mask is not None and mask.suffix.lower() != ".png":
            raise DataError(f"{path} line {i}: mask {mask} is not a PNG; save it as PNG {PNG_ONLY}.")
        if mask is None and missing != "background":
            raise DataError(f"{path} line {i}: image {image} has no mask; give one, or set "
                            "seg.missing_masks=background to read it as all background (good parts).")
        pairs.append(SegPair(image, mask))
    return pairs


def find_pairs(root: str | Path, missing: str = "error") -> list[SegPair]:
    """The pairs of a folder layout (`root` a folder with images/ and masks/) or a CSV (`root` a .csv file).
    `missing`: "error" (every image needs a mask) or "background" (a missing mask is all background)."""
    if missing not in ("error", "background"):
        raise DataError(f"missing masks must be 'error' or 'background', not {missing!r}.")
    root = Path(root)
    if root.suffix.lower() == ".csv":
        return _csv_pairs(root, missing)
    if root.is_file():
        raise DataError(f"{root} is a file, not a CSV of pairs (.csv) or a folder with images/ and masks/.")
    return _folder_pairs(root, missing)


def split_source(root: Path, split: str) -> Path:
    """root/<split>/ (images/ + masks/) or root/<split>.csv; DataError naming both when neither exists."""
    if (root / split).is_dir():  # a folder wins over a CSV of the same name
        return root / split
    if (root / f"{split}.csv").is_file():
        return root / f"{split}.csv"
    raise DataError(f"the {split} split is missing: {root} has neither {split}/ (images/ and masks/) nor "
                    f"{split}.csv (columns image,mask).")
