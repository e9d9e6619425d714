"""Semantic segmentation data: image / mask pairs, their class list, and augmentation applied to both.

Layouts (`find_pairs`, vit/data/seg_pairs.py): `<root>/images/<stem>.<ext>` beside `<root>/masks/<stem>.png`, or a
CSV with the columns `image,mask`. An image without a mask is refused, unless `missing="background"`: then it is all
background (class 0), the inspection-line case where good parts have no mask file.

A mask is an index PNG (mode L, I or 1: a pixel's value is its class) or a palette PNG (mode P: the value is the
palette index, and the palette's colours, without index 255's and the black padding after the last colour,
can be the class list when no names are given). `ignore_index` (255)
marks pixels no loss or metric counts. Every refusal is one sentence naming the file (`DataError`).

Augmentation (`seg_transform`, albumentations): geometric transforms (seg.geometry: resample, a random resized
crop, flips and a rotation; exact, whole-pixel moves only, a larger image read at its own scale) move image and
mask together, the mask with nearest interpolation and the ignore index where a border is left; photometric ones
(colour jitter) touch the image only. Training's val split is read at the files' sizes (`val_files`).

NaFlex (data.naflex): each image keeps its aspect ratio. `seg_transform(None, ...)` leaves the size alone (flips,
rotation and jitter only), and the dataset then resizes the image to the largest patch grid the budget allows
(vit.data.naflex.grid_for_budget) and cuts it into patches; a training mask is resized with it (nearest), an
evaluation mask keeps the file's size, so metrics are counted on the pixels of the file (the logits are resized).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .base import DataError, SeededDataset
from .decode import BadImageError, decode_image
from .seg_pairs import SegPair, find_pairs, split_source

__all__ = ["IGNORE_INDEX", "SegPair", "read_class_names", "find_pairs", "read_mask", "palette_classes",
           "check_mask", "seg_transform", "SegmentationDataset", "seg_classes", "build_seg_datasets",
           "pixel_class_weights", "collate_naflex_seg", "collate_seg_files", "fit_to_budget", "split_source"]

IGNORE_INDEX = 255  # pixels no loss or metric counts (VOC's border, ADE20K's "other")
_MASK_MODES = ("L", "P", "I", "I;16", "1")


def read_class_names(path: str | Path) -> list[str]:
    """Class names from a small file: a JSON list, or one name per line (blank lines skipped); index = line."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"class names file {p} does not exist; give a JSON list or one name per line.")
    text = p.read_text(encoding="utf-8")
    names = json.loads(text) if p.suffix == ".json" else [s.strip() for s in text.splitlines() if s.strip()]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise DataError(f"class names file {p} must hold a non-empty list of names (JSON list or one per line).")
    if len(names) > IGNORE_INDEX:
        raise DataError(f"class names file {p} lists {len(names)} classes; at most {IGNORE_INDEX} fit beside the "
                        f"ignore index {IGNORE_INDEX}.")
    return names


def _palette(img) -> list[tuple[int, int, int]]:
    """The class colours of a palette PNG: its entries without the ignore index's (255) and without the black
    entries that pad a palette to 256 after its last colour."""
    flat = img.getpalette() or []
    colours = [tuple(flat[i:i + 3]) for i in range(0, min(len(flat), 3 * IGNORE_INDEX), 3)]
    while len(colours) > 1 and colours[-1] == (0, 0, 0):
        colours.pop()
    return colours


def _open_mask(path: str | Path, pixels: bool) -> tuple[str, list, np.ndarray | None]:
    """(mode, palette colours, the pixels when `pixels`) of a mask file; one sentence naming it when it is not an
    image, is cut short or is too large."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            colours = _palette(img) if img.mode == "P" else []
            return img.mode, colours, np.array(img) if pixels else None  # a writable copy; a cut file fails here
    except (OSError, SyntaxError, Image.DecompressionBombError) as e:
        raise DataError(f"mask {path} cannot be read ({e}); save it again as an index or palette PNG.") from None


def palette_classes(mask_path: str | Path) -> list[str]:
    """The class list a palette PNG's palette gives: one name per colour ('#rrggbb'), the palette's order."""
    mode, colours, _ = _open_mask(mask_path, pixels=False)
    if mode != "P":
        raise DataError(f"mask {mask_path} is not a palette PNG (mode {mode}); give the class names instead.")
    return ["#{:02x}{:02x}{:02x}".format(*c) for c in colours]


def read_mask(path: str | Path, num_classes: int, palette: list[str] | None = None) -> np.ndarray:
    """A mask file as (H, W) uint8 class indices, checked (`check_mask`). `palette`: the class list when it came
    from the palettes (a palette PNG with more colours than it is refused)."""
    mode, colours, a = _open_mask(path, pixels=True)
    if mode not in _MASK_MODES:
        raise DataError(f"mask {path} is a {mode} image; save it as an index PNG (one channel, the value "
                        "is the class) or a palette PNG.")
    if mode == "P" and palette is not None and len(colours) > len(palette):
        raise DataError(f"mask {path} has a palette of {len(colours)} colours but the class list has "
                        f"{len(palette)}; save every mask with the same palette, one colour per class.")
    if a.dtype != np.uint8:
        if a.min() < 0 or a.max() > IGNORE_INDEX:
            raise DataError(f"mask {path} holds values up to {a.max()}; classes are 0..{num_classes - 1} and "
                            f"{IGNORE_INDEX} is ignored.")
        a = a.astype(np.uint8)
    return check_mask(a, num_classes, path)


def check_mask(mask: np.ndarray, num_classes: int, path) -> np.ndarray:
    """`mask` if every value is a class (< num_classes) or the ignore index; else one sentence naming `path`."""
    bad = np.unique(mask[(mask >= num_classes) & (mask != IGNORE_INDEX)])
    if bad.size:
        raise DataError(f"mask {path} holds the values {bad[:5].tolist()} outside the {num_classes} classes "
                        f"(0..{num_classes - 1}; {IGNORE_INDEX} is ignored); fix the mask or the class list.")
    return mask


def seg_transform(img_size: int | None, train: bool, mean, std, scale: tuple[float, float] = (0.5, 1.0),
                  rotate: float = 15.0, jitter: float = 0.2, interpolation: int | None = None,
                  geometry: str = "resample"):
    """The albumentations pipeline of a split. Train: `geometry` (seg.geometry), then colour jitter (image only):
    resample: a random resized crop (area `scale`), horizontal and vertical flips, a rotation up to `rotate`
    degrees (border pixels: the ignore index in the mask); exact: whole pixels only (an image larger than the input
    read at its own scale, a random window of it, as predict.py's sliding windows read it: vit/data/seg_window.py;
    then flips, quarter turns on a square image, shifts up to an eighth of the side), so a defect one or two pixels
    wide keeps its edges in image and mask alike; none: a resize only. Eval: a resize. Always normalised by
    `mean`, `std` (0..1 scale). Masks use nearest interpolation; `interpolation` (cv2 flag) sets the image's
    (bilinear by default). `img_size` None (NaFlex): no crop and no resize, the image keeps its size (the dataset
    fits it to the patch budget)."""
    import albumentations as A
    import cv2

    interp = cv2.INTER_LINEAR if interpolation is None else interpolation
    fill = tuple(255 * m for m in mean) if mean is not None else 0  # a window's padding: the mean, as predict.py's
    steps = _geometry(img_size, geometry if train else "none", scale, rotate, interp, fill)
    photometric = [A.ColorJitter(jitter, jitter, jitter, 0.0, p=0.8 if jitter else 0.0)] if train else []
    norm = [A.Normalize(mean=tuple(mean), std=tuple(std), max_pixel_value=255.0)] if mean is not None else []
    return A.Compose([*steps, *photometric, *norm])


def _geometry(img_size: int | None, geometry: str, scale, rotate: float, interp: int, fill=0) -> list:
    """seg_transform's geometric steps, applied to image and mask together (masks: nearest)."""
    import albumentations as A
    import cv2

    if geometry not in ("resample", "exact", "none"):
        raise ValueError(f"seg.geometry is resample, exact or none, not {geometry!r}.")
    nearest, size = cv2.INTER_NEAREST, (img_size, img_size)
    if geometry == "none":
        return [] if img_size is None else [A.Resize(*size, interpolation=interp, mask_interpolation=nearest)]
    flips = [A.HorizontalFlip(p=0.5), A.VerticalFlip(p=0.5)]
    border = dict(border_mode=cv2.BORDER_CONSTANT, fill=0, fill_mask=IGNORE_INDEX)
    if geometry == "exact":  # whole pixels only: a nearest shift moves image and mask by the same rounded offset
        turns = [] if img_size is None else [A.RandomRotate90(p=0.5)]
        shift = A.Affine(translate_percent=(-0.125, 0.125), interpolation=nearest, mask_interpolation=nearest,
                         p=0.5, **border)
        from .seg_window import NativeWindow  # albumentations' transform classes, imported for training only

        first = [] if img_size is None else [NativeWindow(img_size, interp, fill)]
        return [*first, *flips, *turns, shift]
    crop = [] if img_size is None else [A.RandomResizedCrop(size=size, scale=scale, interpolation=interp,
                                                            mask_interpolation=nearest)]
    turn = A.Affine(rotate=(-rotate, rotate), interpolation=interp, mask_interpolation=nearest,
                    p=0.5 if rotate else 0, **border)
    return [*crop, *flips, turn]


class SegmentationDataset(SeededDataset):
    """(image (3, S, S) float32, mask (S, S) int64) per pair; masks read and checked when first loaded.
    `palette`: the class list when it came from the masks' palettes (`palette_classes`). `naflex` (patch size,
    max_num_patches, resize_mask): (a patchify dict, mask) per pair instead (module docstring), batched by
    `collate`; `resize_mask` False keeps the mask at the file's size."""

    def __init__(self, pairs: list[SegPair], classes: list[str], transform, seed: int = 0,
                 palette: list[str] | None = None, naflex: tuple[int, int, bool] | None = None) -> None:
        super().__init__(transform, classes, seed)
        self.pairs, self.palette, self.naflex = pairs, palette, naflex
        self.bad: list[str] = []  # unreadable images `check` dropped
        self.collate = collate_naflex_seg if naflex else None

    def __len__(self) -> int:
        return len(self.pairs)

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """The pair as read: image (H, W, 3) uint8 and mask (H, W) uint8, their sizes checked against each other."""
        pair = self.pairs[index]
        image = decode_image(pair.image)
        if pair.mask is None:
            return image, np.zeros(image.shape[:2], np.uint8)
        mask = read_mask(pair.mask, len(self.classes), self.palette)
        _check_size(pair, mask.shape, image.shape[:2])
        return image, mask

    def check(self, on_bad_image: str = "error") -> list[str]:
        """Read every pair once before training: each mask whole (a value outside the classes, or another size
        than its image's, is refused in one sentence naming the file); each image at a reduced scale, as imagefolder
        checks its images (its size from the header): an unreadable one is refused (`on_bad_image` error) or its
        pair dropped (skip) and named in `self.bad`."""
        good, bad = [], []
        for pair in self.pairs:
            try:
                decode_image(pair.image, max_side=64)  # readable: a large JPEG decoded at 1/8 scale
            except BadImageError as e:
                bad.append(str(e))
                continue
            if pair.mask is not None:
                _check_size(pair, read_mask(pair.mask, len(self.classes), self.palette).shape, image_size(pair.image))
            good.append(pair)
        if bad and on_bad_image == "error":
            raise DataError(f"{len(bad)} unreadable image(s) among the segmentation pairs, first: {bad[0]}; remove "
                            "them or set data.on_bad_image=skip.")
        if bad and not good:
            raise DataError(f"no usable image among the segmentation pairs: all {len(bad)} are unreadable (first: "
                            f"{bad[0]}); fix or replace them.")
        self.pairs, self.bad = good, bad
        return bad

    def __getitem__(self, index: int):
        import torch

        image, mask = self.load(index)
        self.transform.set_random_seed(self.sample_seed(index))
        out = self.transform(image=image, mask=mask)
        image, mask = out["image"], out["mask"]
        if self.naflex:
            image, mask = self._fit_budget(image, mask)
        x = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))).float()
        y = torch.from_numpy(np.ascontiguousarray(mask)).long()
        if self.naflex:
            from .naflex import patchify

            return patchify(x, self.naflex[0]), y
        return x, y

    def _fit_budget(self, image: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The image resized to its NaFlex grid's pixels (`fit_to_budget`), the mask with it (nearest) or kept."""
        import cv2

        patch, budget, resize_mask = self.naflex
        image = fit_to_budget(image, patch, budget)
        size = (image.shape[1], image.shape[0])
        return image, (cv2.resize(mask, size, interpolation=cv2.INTER_NEAREST) if resize_mask else mask)


def fit_to_budget(image: np.ndarray, patch: int, budget: int) -> np.ndarray:
    """An (H, W, C) image resized (bilinear, OpenCV) to the pixels of the largest patch grid `budget` patches allow
    at its aspect ratio (vit.data.naflex.grid_for_budget): what a NaFlex segmenter reads, in training, evaluation
    and predict.py alike."""
    import cv2

    from .naflex import grid_for_budget

    h, w = grid_for_budget(*image.shape[:2], patch, budget)
    return cv2.resize(image, (w * patch, h * patch), interpolation=cv2.INTER_LINEAR)


def _check_size(pair: SegPair, mask: tuple[int, int], image: tuple[int, int]) -> None:
    """One sentence naming both files when a mask's (height, width) is not its image's."""
    if tuple(mask) != tuple(image):
        raise DataError(f"mask {pair.mask} is {mask[1]}x{mask[0]} but its image {pair.image} is {image[1]}x{image[0]}; "
                        "masks must have their image's size.")


def image_size(path) -> tuple[int, int]:
    """(height, width) of an image file as `decode_image` gives it (EXIF orientation applied), from its header."""
    from PIL import Image

    with Image.open(path) as img:
        w, h = img.size
        turned = img.getexif().get(0x0112) in (5, 6, 7, 8)  # orientations that swap width and height
    return (w, h) if turned else (h, w)


def collate_seg_files(batch: list[tuple]) -> tuple[list, list]:
    """[(image (3, H_i, W_i), mask (H_i, W_i)), ...] -> (the images as a list, the masks as a list): images at their
    files' sizes, each read on its own."""
    return [x for x, _ in batch], [y for _, y in batch]


def collate_naflex_seg(batch: list[tuple]) -> tuple:
    """[(patchify dict, mask (H_i, W_i)), ...] -> (the NaFlex batch dict padded to its longest image, the masks as a
    list: each image has its own size)."""
    from .naflex import collate_naflex

    return collate_naflex([(sample, 0) for sample, _ in batch])[0], [mask for _, mask in batch]


def seg_classes(seg, pairs: list[SegPair]) -> tuple[list[str], list[str] | None]:
    """(class names, the palette's class list or None): seg.classes, seg.classes_file, or the palette of the first
    palette mask among `pairs` ('#rrggbb' names)."""
    if seg.classes is not None:
        return list(seg.classes), None
    if seg.classes_file is not None:
        return read_class_names(seg.classes_file), None
    first = next((p.mask for p in pairs if p.mask is not None), None)
    if first is None:
        raise DataError("no mask to read a palette from; name the classes with seg.classes or seg.classes_file.")
    names = palette_classes(first)
    return names, names


def build_seg_datasets(cfg, splits: tuple[str, ...] = ("train", "val"), classes: list[str] | None = None,
                       augment: bool = True, val_files: bool = False):
    """(train, val, class names) of data.dataset=segmentation: data.root/train and data.root/val as the folder
    layout (or train.csv / val.csv), transforms from model.img_size, aug.mean / aug.std and seg.geometry.
    `classes` (a checkpoint's) are used as given; a split left out of `splits` is None. `augment` False
    (scoring): the train split read as val is, without augmentation and, with NaFlex, with its masks at the files'
    size. `val_files` (training's evaluation): val images and masks at the files' own sizes, batched as
    lists (`collate_seg_files`), so each is scored as predict.py reads it (vit.eval.segmentation.image_logits)."""
    root, seg, aug = Path(cfg.data.root), cfg.seg, cfg.aug
    pairs = {s: find_pairs(split_source(root, s), seg.missing_masks) for s in ("train", "val") if s in splits}
    palette = None
    if classes is None:
        classes, palette = seg_classes(seg, next(iter(pairs.values())))
    mean, std = aug.mean or [0.5] * 3, aug.std or [0.5] * 3
    nf = cfg.data.naflex
    size = None if nf is not None else cfg.model.img_size

    def build(s: str) -> SegmentationDataset:
        train, files = augment and s == "train", val_files and s == "val" and nf is None
        naflex = None if nf is None else (cfg.model.patch_size, nf.max_num_patches, train)
        t = seg_transform(None if files else size, train, mean, std, geometry=seg.geometry)
        ds = SegmentationDataset(pairs[s], classes, t, cfg.run.seed, palette, naflex)
        if files:
            ds.collate = collate_seg_files
        return ds

    out = [build(s) if s in pairs else None for s in ("train", "val")]
    return out[0], out[1], list(classes)


def pixel_class_weights(ds: SegmentationDataset):
    """optim.class_weights=auto for segmentation: n / (C * n_c) over the training masks' pixels (as read, before
    augmentation; the ignore index not counted), a class with no pixel weighted as if it had one."""
    import torch

    counts = np.zeros(len(ds.classes), np.int64)
    for i in range(len(ds)):
        mask = ds.load(i)[1]
        counts += np.bincount(mask[mask != IGNORE_INDEX].ravel(), minlength=len(ds.classes))[:len(ds.classes)]
    counts = np.maximum(counts, 1)
    return torch.tensor(counts.sum() / (len(counts) * counts), dtype=torch.float32)
