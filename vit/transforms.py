"""Image decoding and the albumentations pipelines, one per split, built from `AugConfig`.

Decoding turns whatever a folder holds into RGB uint8 (H, W, 3): EXIF orientation applied, grayscale and
16-bit scaled to 8 bits, palette and alpha images converted; an unreadable file raises `BadImageError`.
Training: random resized crop (or resize) -> affine jitter -> flip -> colour jitter -> RandAugment-like ops
-> random erasing -> normalized CHW tensor. Evaluation: resize (and centre crop) -> normalize -> tensor.
Random draws are seeded per (epoch, index) by the dataset, so an epoch's augmentations are reproducible on
resume and independent of worker count.
"""

from __future__ import annotations

import math
import random
import warnings
from pathlib import Path

import albumentations as A
import cv2
import numpy as np
import torch
from PIL import Image, ImageOps

from .config import AugConfig

__all__ = ["BadImageError", "decode_image", "build_transform", "to_rgb_array"]

Image.MAX_IMAGE_PIXELS = 256_000_000  # very large images are decoded (cheaply, see below) not refused


class BadImageError(ValueError):
    """The file is not an image we can decode."""


def to_rgb_array(img: Image.Image) -> np.ndarray:
    """Any PIL image -> RGB uint8 (H, W, 3)."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        a = np.asarray(img, dtype=np.float64)
        hi = 65535.0 if img.mode.startswith("I;16") or a.max() > 255 else 255.0
        a = np.clip(a / hi * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return np.repeat(a[..., None], 3, axis=2)
    if img.mode == "F":
        a = np.asarray(img, dtype=np.float64)
        a = np.clip(a * (255.0 if a.max() <= 1.0 else 1.0), 0, 255).astype(np.uint8)
        return np.repeat(a[..., None], 3, axis=2)
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA"):
        img = img.convert("RGBA")
        bg = Image.new("RGBA", img.size, (255, 255, 255, 255))
        img = Image.alpha_composite(bg, img)  # transparent areas become white, not black
    return np.asarray(img if img.mode == "RGB" else img.convert("RGB"))


def decode_image(path: str | Path, max_side: int | None = None) -> np.ndarray:
    """Read an image file as RGB uint8 (H, W, 3). With `max_side`, a large JPEG is decoded at a reduced
    scale (libjpeg's DCT scaling) so that its shorter side stays at least `max_side` pixels."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(path)
            if max_side and img.format == "JPEG":
                w, h = img.size
                img.draft("RGB", (max(max_side, math.ceil(w * max_side / min(w, h))),
                                  max(max_side, math.ceil(h * max_side / min(w, h)))))
            img = ImageOps.exif_transpose(img)
            arr = to_rgb_array(img)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise BadImageError(f"cannot decode image {path}: {e}") from None
    if arr.ndim != 3 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise BadImageError(f"cannot decode image {path}: empty image")
    return arr


def _rand_augment(n: int) -> A.BaseCompose:
    """A RandAugment-like policy (Cubuk et al., 2020): `n` ops drawn from a fixed list, each at magnitude ~9."""
    ops = [
        A.Affine(rotate=(-30, 30), p=1.0),
        A.Affine(shear={"x": (-17, 17)}, p=1.0),
        A.Affine(shear={"y": (-17, 17)}, p=1.0),
        A.Affine(translate_percent={"x": (-0.45, 0.45)}, p=1.0),
        A.Affine(translate_percent={"y": (-0.45, 0.45)}, p=1.0),
        A.RandomBrightnessContrast(0.4, 0.4, p=1.0),
        A.Equalize(p=1.0),
        A.Posterize(num_bits=(4, 8), p=1.0),
        A.Solarize(threshold_range=(0.5, 1.0), p=1.0),
        A.Sharpen(p=1.0),
        A.InvertImg(p=1.0),
        A.HueSaturationValue(p=1.0),
    ]
    return A.SomeOf(ops, n=n, p=1.0)


class Pipeline:
    """An albumentations Compose on uint8 images, then one step to a normalized, contiguous (C, H, W) tensor.

    Normalization is a per-channel lookup table (256 float32 entries per channel: (v - mean) / std) applied
    plane by plane with cv2.LUT straight into the CHW output: one pass instead of albumentations' Normalize, a
    transpose and a copy (~160 us instead of ~400 us at 224 px). The random generators are created once and
    re-seeded in place per sample (~40 us), instead of `set_random_seed`, which builds new generators for every
    transform on every call (~450 us)."""

    def __init__(self, compose: A.Compose, mean, std) -> None:
        self.compose = compose
        self.luts = [((np.arange(256) - 255.0 * m) / (255.0 * s)).astype(np.float32).reshape(1, 256)
                     for m, s in zip(mean, std)]
        self.np_rng, self.py_rng = np.random.default_rng(0), random.Random(0)
        compose.set_random_state(self.np_rng, self.py_rng)

    def reseed(self, seed: int) -> None:
        self.py_rng.seed(seed)
        self.np_rng.bit_generator.state = np.random.PCG64(seed).state

    def __call__(self, image: np.ndarray, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self.reseed(seed)
        out = self.compose(image=image)["image"]  # (H, W, C) uint8
        planes = cv2.split(out)
        if len(planes) != len(self.luts):
            raise ValueError(f"image has {len(planes)} channels, the normalization expects {len(self.luts)}.")
        dst = np.empty((len(planes), *out.shape[:2]), dtype=np.float32)
        for c, plane in enumerate(planes):
            cv2.LUT(plane, self.luts[c], dst=dst[c])
        return torch.from_numpy(dst)


def build_transform(aug: AugConfig, img_size: int, train: bool) -> Pipeline:
    """The pipeline for one split; input RGB uint8 (H, W, 3), output float tensor (3, S, S)."""
    size = (img_size, img_size)
    interp = cv2.INTER_CUBIC if aug.interpolation == "bicubic" else cv2.INTER_LINEAR
    steps: list = []
    if train:
        if aug.random_resized_crop:
            steps.append(A.RandomResizedCrop(size, scale=tuple(aug.scale), ratio=tuple(aug.ratio),
                                             interpolation=interp))
        else:
            steps.append(A.Resize(*size, interpolation=interp))
        if aug.affine_translate or aug.affine_rotate or aug.affine_scale:
            steps.append(A.Affine(
                scale=(1 - aug.affine_scale, 1 + aug.affine_scale),
                translate_percent=(-aug.affine_translate, aug.affine_translate),
                rotate=(-aug.affine_rotate, aug.affine_rotate),
                interpolation=cv2.INTER_LINEAR, p=1.0,
            ))
        if aug.hflip:
            steps.append(A.HorizontalFlip(p=aug.hflip))
        if aug.color_jitter:
            j = aug.color_jitter
            steps.append(A.ColorJitter(brightness=j, contrast=j, saturation=j, hue=0.0, p=0.8))
        if aug.rand_augment_ops:
            steps.append(_rand_augment(aug.rand_augment_ops))
        if aug.random_erasing:
            # filled with the mean colour: zero after normalization, as timm's 'const' random erasing
            steps.append(A.Erasing(p=aug.random_erasing, fill=tuple(round(255 * m) for m in aug.mean)))
    else:
        resize = int(round(img_size / aug.eval_crop_pct))
        steps.append(A.SmallestMaxSize(max_size=resize, interpolation=interp))
        steps.append(A.CenterCrop(*size))
    return Pipeline(A.Compose(steps, seed=0, is_check_shapes=False), aug.mean, aug.std)


def apply(transform: Pipeline, image: np.ndarray, seed: int | None = None) -> torch.Tensor:
    """Run a pipeline on an RGB uint8 array, optionally seeded; returns a (C, H, W) float tensor."""
    return transform(image, seed)
