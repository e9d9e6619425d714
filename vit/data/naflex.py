"""NaFlex data: each image at its own aspect ratio as a variable number of patches (NaViT, Dehghani et al., 2023;
FlexiViT's patch budget; timm's NaFlexViT), in timm's batch convention:

    {"patches": float (B, N, P*P*C), "patch_coord": long (B, N, 2) (row, col in the image's own grid),
     "patch_valid": bool (B, N) (False: padding)}, labels (B,)

An image of H x W pixels is resized to the largest grid (h, w) that `max_num_patches` allows (`grid_for_budget`,
timm's `get_image_size_for_seq` rule), so h / w follows H / W up to one patch's rounding, then cut into P x P
patches, each flattened row by row with the channels last (timm's `patchify_image`, channels_last=True).
Batches are filled up to a token budget (`BudgetBatchSampler`: images x the batch's longest sequence), so a batch
of short sequences holds more images, as timm's NaFlex loader does; `collate_naflex` pads each batch to its
longest sequence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import torch
from torch.utils.data import Sampler

from ..config import AugConfig
from ..layers.naflex import patchify as patchify_batch
from .base import DataError
from .transforms import Pipeline, build_transform

__all__ = ["grid_for_budget", "SequenceResize", "patchify", "unpatchify", "as_picture", "NaFlexTransform",
           "build_naflex_transform", "collate_naflex", "image_size", "sequence_lengths", "BudgetBatchSampler"]


MAX_SCALE, SCALE_TOL = 100.0, 1e-5  # timm's search range for the scale (upper end) and its tolerance


def grid_for_budget(height: int, width: int, patch_size: int, max_num_patches: int) -> tuple[int, int]:
    """The patch grid (h, w) an image of `height` x `width` pixels is resized to: (ceil(r H / P), ceil(r W / P)),
    at least one patch a side, for the largest scale r whose grid holds at most `max_num_patches` patches.

    timm's rule (get_image_size_for_seq, divisible_by_patch=True), reproduced to the patch: r is found by bisection
    on (SCALE_TOL / 10, MAX_SCALE) down to a width of SCALE_TOL, in floats. Two consequences follow it: an image
    is enlarged less than MAX_SCALE times, and where two sides cross a whole number of patches within SCALE_TOL of
    each other the grid stops one patch short of the exact optimum (e.g. 2984 x 2155 px, P 8, 256 patches:
    18 x 13, where 19 x 13 fits)."""
    if min(height, width, patch_size, max_num_patches) < 1:
        raise ValueError(f"image {height}x{width}, patch {patch_size} and max_num_patches {max_num_patches} must "
                         "all be positive.")

    def grid(r: float) -> tuple[int, int]:
        return max(1, math.ceil(height * r / patch_size)), max(1, math.ceil(width * r / patch_size))

    lo, hi = SCALE_TOL / 10, MAX_SCALE
    while hi - lo >= SCALE_TOL:  # the patch count grows with r: keep lo feasible, hi not
        mid = (lo + hi) / 2
        h, w = grid(mid)
        lo, hi = (mid, hi) if h * w <= max_num_patches else (lo, mid)
    if lo <= SCALE_TOL:
        raise ValueError(f"an image of {height}x{width} pixels cannot be shrunk to {max_num_patches} patches of "
                         f"{patch_size} px (it would need a scale under {SCALE_TOL}); resize it first.")
    return grid(lo)


class SequenceResize:
    """The geometry step of a `Pipeline` (vit.data.transforms) for NaFlex: the whole image, resized to
    `grid_for_budget`'s grid times the patch size (no crop, so nothing near the edges is lost)."""

    def __init__(self, patch_size: int, max_num_patches: int, interpolation: int) -> None:
        self.patch_size, self.max_num_patches, self.interp = patch_size, max_num_patches, interpolation

    def size_for(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) in pixels of the resized image."""
        h, w = grid_for_budget(height, width, self.patch_size, self.max_num_patches)
        return w * self.patch_size, h * self.patch_size

    def box(self, w: int, h: int, rng) -> tuple[int, int, int, int]:
        return 0, 0, w, h

    def need(self, box) -> tuple[float, float]:
        """The source size that is resized down, not up: the output's (a JPEG is decoded no smaller)."""
        return self.size_for(box[2], box[3])

    def __call__(self, img: np.ndarray, box) -> np.ndarray:
        x, y, w, h = box
        return cv2.resize(img[y:y + h, x:x + w], self.size_for(w, h), interpolation=self.interp)


def patchify(image: torch.Tensor, patch_size: int) -> dict[str, torch.Tensor]:
    """(C, h P, w P) -> {"patches": (h w, P P C), "patch_coord": (h w, 2) (row, col), "patch_valid": (h w,) all
    True}, patches in row-major grid order, each flattened (row, col, channel) as timm's patchify_image."""
    _, height, width = image.shape
    p = patch_size
    if height % p or width % p:
        raise ValueError(f"image {height}x{width} is not a whole number of {p}x{p} patches; resize it first.")
    return {k: v[0].contiguous() for k, v in patchify_batch(image[None], (p, p)).items()}  # the model's own cut


def unpatchify(sample: dict[str, torch.Tensor], patch_size: int) -> torch.Tensor:
    """One image's patches back to its (C, h P, w P) picture: the valid patches of `sample` (a `patchify`
    output, or row i of a batch: (N, P P C), (N, 2), (N,)) placed at their coordinates."""
    valid = sample["patch_valid"]
    patches, coord = sample["patches"][valid], sample["patch_coord"][valid]  # (n, P P C), (n, 2)
    p = patch_size
    c = patches.shape[1] // (p * p)
    h, w = int(coord[:, 0].max()) + 1, int(coord[:, 1].max()) + 1
    grid = patches.new_zeros(h, w, p, p, c)
    grid[coord[:, 0], coord[:, 1]] = patches.reshape(-1, p, p, c)
    return grid.permute(4, 0, 2, 1, 3).reshape(c, h * p, w * p)


def as_picture(sample: torch.Tensor | dict[str, torch.Tensor], patch_size: int | None) -> torch.Tensor:
    """What a model saw of one image as a picture (C, H, W): an image tensor as it is, a NaFlex sample (a
    `patchify` dict) its patches put back at their coordinates (`unpatchify`), at its own aspect ratio."""
    return unpatchify(sample, patch_size) if isinstance(sample, dict) else sample


class NaFlexTransform:
    """A `Pipeline` whose geometry is `SequenceResize`, its output patchified: the same `__call__(image, seed)`,
    `load(path, seed)` and `load_bytes` as the pipeline, each returning `patchify`'s dict."""

    def __init__(self, pipeline: Pipeline, patch_size: int) -> None:
        self.pipeline, self.patch_size = pipeline, patch_size
        self.geometry = pipeline.geometry

    def __call__(self, image: np.ndarray, seed: int | None = None) -> dict[str, torch.Tensor]:
        return patchify(self.pipeline(image, seed), self.patch_size)

    def load(self, path: str | Path, seed: int | None = None) -> dict[str, torch.Tensor]:
        return patchify(self.pipeline.load(path, seed), self.patch_size)

    def load_bytes(self, data: bytes, path: str | Path, seed: int | None = None) -> dict[str, torch.Tensor]:
        return patchify(self.pipeline.load_bytes(data, path, seed), self.patch_size)


def build_naflex_transform(aug: AugConfig, patch_size: int, max_num_patches: int, train: bool) -> NaFlexTransform:
    """The NaFlex pipeline of one split: `SequenceResize` in place of the crop, then the split's usual steps
    (training: flip, colour jitter, ... as aug.* sets them; evaluation: none), normalised, patchified."""
    aug = aug.resolved()
    interp = cv2.INTER_CUBIC if aug.interpolation == "bicubic" else cv2.INTER_LINEAR
    geometry = SequenceResize(patch_size, max_num_patches, interp)
    return NaFlexTransform(build_transform(aug, patch_size, train, geometry=geometry), patch_size)


def collate_naflex(batch: list[tuple]) -> tuple:
    """[(sample dict, label[, index]), ...] -> (the batch dict padded to the longest sequence, labels (B,)[,
    indices (B,)]). Padding rows are zeros with coordinate (0, 0) and patch_valid False, as timm's collator."""
    samples = [item[0] for item in batch]
    n = max(len(s["patches"]) for s in samples)
    b, dim = len(samples), samples[0]["patches"].shape[1]
    patches = torch.zeros(b, n, dim, dtype=samples[0]["patches"].dtype)  # (B, N, P P C)
    coord = torch.zeros(b, n, 2, dtype=torch.long)  # (B, N, 2)
    valid = torch.zeros(b, n, dtype=torch.bool)  # (B, N)
    for i, s in enumerate(samples):
        k = len(s["patches"])
        patches[i, :k], coord[i, :k], valid[i, :k] = s["patches"], s["patch_coord"], s["patch_valid"]
    rest = [torch.stack(column) if torch.is_tensor(column[0]) else torch.tensor(column, dtype=torch.long)
            for column in list(zip(*batch))[1:]]
    return ({"patches": patches, "patch_coord": coord, "patch_valid": valid}, *rest)


def image_size(path: str | Path) -> tuple[int, int] | None:
    """(height, width) of an image file as displayed (EXIF orientation applied), from its header; None when it
    cannot be read (the dataset's check names it)."""
    from PIL import Image

    try:
        with Image.open(path) as img:  # lazy: the header only
            (w, h), orientation = img.size, img.getexif().get(0x0112, 1)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None
    return (w, h) if orientation in (5, 6, 7, 8) else (h, w)  # a quarter turn swaps the sides


def sequence_lengths(dataset, patch_size: int, max_num_patches: int) -> list[int]:
    """The number of patches of every sample, from the image sizes alone (no decoding): an in-memory dataset's
    arrays (`images`, (N, H, W, 3)) or a folder dataset's files (`samples`, or a segmentation dataset's `pairs`:
    header sizes). An unreadable file counts as a full sequence."""
    if hasattr(dataset, "images"):
        sizes = [tuple(im.shape[:2]) for im in dataset.images]
    elif hasattr(dataset, "samples"):
        sizes = [image_size(path) for path, _ in dataset.samples]
    elif hasattr(dataset, "pairs"):  # segmentation: image / mask pairs (vit/data/segmentation.py)
        sizes = [image_size(pair.image) for pair in dataset.pairs]
    else:
        raise DataError(f"data.naflex batches by sequence length, which {type(dataset).__name__} cannot tell "
                        "before reading its images; use an image folder, digits, cifar or synthetic data.")
    out = []
    for s in sizes:
        h, w = grid_for_budget(*s, patch_size, max_num_patches) if s else (max_num_patches, 1)
        out.append(h * w)
    return out


class BudgetBatchSampler(Sampler[list[int]]):
    """Batches of indices whose padded size, images x the batch's longest sequence, is at most `max_tokens`.

    shuffle=False: consecutive images in dataset order (evaluation). shuffle=True: the images sorted by length,
    equal lengths in the order of `sampler`'s (seed, epoch) permutation (`EpochSampler`), cut greedily into
    batches, the batches then shuffled, also by (seed, epoch). The cut depends on the sorted lengths only, so
    every epoch has the same number of batches (the learning-rate schedule counts on it) and a resumed epoch,
    skipping the batches already seen, continues exactly. Accelerate finds `set_epoch` here and on `sampler`."""

    def __init__(self, lengths: Sequence[int], max_tokens: int, sampler) -> None:
        self.lengths, self.max_tokens, self.sampler = [int(n) for n in lengths], int(max_tokens), sampler
        longest = max(self.lengths, default=0)
        if longest > self.max_tokens:
            raise ValueError(f"an image of {longest} patches does not fit a batch budget of {self.max_tokens} tokens; "
                             "raise the budget to at least max_num_patches.")
        self.batch_size = None  # varies: Accelerate deals whole batches to processes
        self._count = len(self.batches())

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def _cut(self, order: Sequence[int]) -> list[list[int]]:
        batches, batch, longest = [], [], 0
        for i in order:
            n = self.lengths[i]
            if batch and (len(batch) + 1) * max(longest, n) > self.max_tokens:
                batches.append(batch)
                batch, longest = [], 0
            batch.append(i)
            longest = max(longest, n)
        return batches + ([batch] if batch else [])

    def batches(self) -> list[list[int]]:
        """This epoch's batches."""
        if not self.sampler.shuffle:
            return self._cut(range(len(self.lengths)))
        rank = {i: r for r, i in enumerate(self.sampler)}  # the (seed, epoch) permutation breaks length ties
        batches = self._cut(sorted(rank, key=lambda i: (self.lengths[i], rank[i])))
        g = torch.Generator().manual_seed(self.sampler.seed * 7919 + self.sampler.epoch + 104729)
        return [batches[k] for k in torch.randperm(len(batches), generator=g).tolist()]

    def __iter__(self):
        return iter(self.batches())

    def __len__(self) -> int:
        return self._count
