"""The training and evaluation pipelines, one per split, built from `AugConfig` (decoding: `vit.data.decode`).

Training: random resized crop (or resize) -> affine jitter -> flip -> colour jitter -> RandAugment-like ops
-> random erasing -> normalized CHW tensor. Evaluation: resize the shorter side, centre crop, normalize.
The crop, flip, colour jitter and normalization are our own OpenCV/numpy code (the common recipe costs about
0.5 ms per 224-px image on one core); affine jitter, RandAugment-like ops and random erasing are
albumentations transforms, run as one Compose on the same random generators.

`Pipeline.load(path, seed)` decides the crop before decoding: a JPEG whose crop is at least twice the output
size is decoded at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling, which also low-passes what the resize would
alias), so a 12-megapixel photo costs a fraction of a full decode.

Random draws are seeded per (epoch, index) by the dataset, so an epoch's augmentations are reproducible on
resume and independent of worker count; `load(path, seed)` and `pipeline(decode_image(path), seed)` draw the
same crop.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import TYPE_CHECKING

import cv2
import numpy as np
import torch

from ..config import AugConfig
from .decode import decode_bytes, is_complete_jpeg, jpeg_reduction, jpeg_size, read_bytes

if TYPE_CHECKING:
    import albumentations as A

__all__ = ["build_transform", "Pipeline"]

GRAY = (0.299, 0.587, 0.114)  # ITU-R 601 luma, as torchvision's rgb_to_grayscale


def _rand_augment(n: int) -> A.BaseCompose:
    """A RandAugment-like policy (Cubuk et al., 2020): `n` ops drawn from a fixed list, each at magnitude ~9."""
    import albumentations as A

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


class _Geometry:
    """First step of every pipeline: picks a source box (x, y, w, h) from the image size, then resizes it.
    Splitting the two lets `Pipeline.load` choose the JPEG decoding scale between them."""

    def __init__(self, size: int, interpolation: int) -> None:
        self.size, self.interp = size, interpolation

    def box(self, w: int, h: int, rng: random.Random) -> tuple[int, int, int, int]:
        return 0, 0, w, h

    def need(self, box) -> tuple[float, float]:
        """The smallest source-box size (w, h) that is resized down, not up."""
        return self.size, self.size

    def __call__(self, img: np.ndarray, box) -> np.ndarray:
        x, y, w, h = box
        return cv2.resize(img[y:y + h, x:x + w], (self.size, self.size), interpolation=self.interp)


class _RandomResizedCrop(_Geometry):
    """Inception-style crop (Szegedy et al., 2015) with torchvision's sampling: up to 10 tries of an area
    fraction uniform in `scale` and a log-uniform aspect ratio in `ratio`, else the centre crop with the
    ratio clamped; the box is then resized to size x size."""

    def __init__(self, size: int, scale, ratio, interpolation: int) -> None:
        super().__init__(size, interpolation)
        self.scale, self.log_ratio = tuple(scale), (math.log(ratio[0]), math.log(ratio[1]))

    def box(self, w: int, h: int, rng: random.Random) -> tuple[int, int, int, int]:
        area = w * h
        for _ in range(10):
            target = area * rng.uniform(*self.scale)
            ar = math.exp(rng.uniform(*self.log_ratio))
            cw, ch = round(math.sqrt(target * ar)), round(math.sqrt(target / ar))
            if 0 < cw <= w and 0 < ch <= h:
                return rng.randint(0, w - cw), rng.randint(0, h - ch), cw, ch
        lo, hi = math.exp(self.log_ratio[0]), math.exp(self.log_ratio[1])
        if w / h < lo:
            cw, ch = w, round(w / lo)
        elif w / h > hi:
            cw, ch = round(h * hi), h
        else:
            cw, ch = w, h
        return (w - cw) // 2, (h - ch) // 2, cw, ch


class _ResizeCenterCrop(_Geometry):
    """Evaluation: shorter side to `resize` (timm's crop_pct convention), then the centre size x size.
    `resize` >= size (crop_pct <= 1), so the crop always fits."""

    def __init__(self, size: int, resize: int, interpolation: int) -> None:
        super().__init__(size, interpolation)
        self.resize = resize

    def need(self, box) -> tuple[float, float]:
        w, h = box[2], box[3]
        s = self.resize / min(w, h)
        return w * s, h * s

    def __call__(self, img: np.ndarray, box) -> np.ndarray:
        h, w = img.shape[:2]  # sizes and offsets rounded as torchvision's Resize(int) and CenterCrop
        if w <= h:
            nw, nh = self.resize, int(self.resize * h / w)
        else:
            nw, nh = int(self.resize * w / h), self.resize
        out = cv2.resize(img, (nw, nh), interpolation=self.interp)
        y, x = int(round((nh - self.size) / 2)), int(round((nw - self.size) / 2))
        return out[y:y + self.size, x:x + self.size]


class _Flip:
    def __init__(self, p: float) -> None:
        self.p = p

    def __call__(self, img: np.ndarray, rng: random.Random) -> np.ndarray:
        return cv2.flip(img, 1, dst=img) if rng.random() < self.p else img  # in place: the pipeline owns img


_IDENTITY_3x4 = ((1.0, 0.0, 0.0, 0.0), (0.0, 1.0, 0.0, 0.0), (0.0, 0.0, 1.0, 0.0))


class _ColorJitter:
    """torchvision's ColorJitter (brightness, contrast, saturation, in random order) with probability p.

    Each op is an affine map of the RGB values: brightness scales, contrast blends with the image's mean grey
    level, saturation blends each pixel with its own grey level. Ops with a factor <= 1 keep values in
    [0, 255], so they compose exactly into one pending 3x4 matrix; an op with a factor > 1 can leave that range
    and is applied then (one cv2.transform, which rounds and clips as the op itself does) unless it is the
    last. The contrast op's mean is that of the pending map applied to the image's channel means (exact, the
    map being affine). A pending map without saturation is a per-value table, handed on to the normalization
    for free. At most three passes over the pixels, 1.5 on average; values are rounded once per pass, not
    after every op as in torchvision (results within a few levels of it)."""

    def __init__(self, brightness: float, contrast: float, saturation: float, p: float) -> None:
        self.ranges = [(max(0.0, 1 - f), 1 + f) for f in (brightness, contrast, saturation)]
        self.p = p
        self.values = np.arange(256, dtype=np.float64)

    def params(self, rng: random.Random) -> tuple[list[int], list[float]] | None:
        """None (no jitter), or the op order (0 brightness, 1 contrast, 2 saturation) and the three factors."""
        if rng.random() >= self.p:
            return None
        return rng.sample(range(3), 3), [rng.uniform(*r) for r in self.ranges]

    def __call__(self, img: np.ndarray, rng: random.Random) -> tuple[np.ndarray, np.ndarray | None]:
        params = self.params(rng)
        return (img, None) if params is None else self.apply(img, *params)

    def apply(self, img: np.ndarray, order, factors) -> tuple[np.ndarray, np.ndarray | None]:
        """-> (image, pending uint8 value table or None); the image is changed in place. The 3x4 map is
        kept in Python floats: numpy's per-call overhead on 3x4 arrays cost more than the pixel passes."""
        g = GRAY
        m = _IDENTITY_3x4  # out = m[:, :3] @ rgb + m[:, 3]; each op builds a new m
        means, mixes = None, False  # channel means of img as it is now; whether m mixes channels
        for k, op in enumerate(order):
            f = factors[op]
            if op == 0:
                m = [[f * v for v in row] for row in m]
            elif op == 1:
                if means is None:
                    means = cv2.mean(img)
                grey = sum(g[r] * (row[0] * means[0] + row[1] * means[1] + row[2] * means[2] + row[3])
                           for r, row in enumerate(m))
                m = [[f * row[0], f * row[1], f * row[2], f * row[3] + (1 - f) * grey] for row in m]
            else:
                col = [g[0] * m[0][c] + g[1] * m[1][c] + g[2] * m[2][c] for c in range(4)]  # grey of the output
                m = [[f * row[c] + (1 - f) * col[c] for c in range(4)] for row in m]
                mixes = True
            if f > 1 and k < len(order) - 1:  # values may leave [0, 255]: clip them now, as the op does
                img = cv2.transform(img, np.array(m), dst=img)
                m, means, mixes = _IDENTITY_3x4, None, False
        if not mixes:  # v -> m[0][0] * v + m[0][3] for every channel: a table
            return img, np.clip(np.rint(self.values * m[0][0] + m[0][3]), 0, 255).astype(np.uint8)
        return cv2.transform(img, np.array(m), dst=img), None


class _Albumentations:
    """Consecutive albumentations transforms, run as one Compose on the pipeline's generators."""

    def __init__(self, transforms: list) -> None:
        import albumentations as A

        self.compose = A.Compose(transforms, seed=0, is_check_shapes=False)

    def __call__(self, img: np.ndarray, rng: random.Random) -> np.ndarray:
        return self.compose(image=img)["image"]


class Pipeline:
    """Geometry, then per-sample steps on uint8 (H, W, 3), then one step to a normalized (C, H, W) tensor,
    C = len(mean): 3, or 1 for a single-channel model (the RGB image is converted to its luma last).

    Normalization is a per-channel lookup table (256 float32 entries per channel: (v - mean) / std) applied
    plane by plane with cv2.LUT straight into the CHW output; a pending colour-jitter table is folded into it
    for free. Our steps draw from one `random.Random` (a scalar draw costs ~0.1 us there, ~2 us from a numpy
    Generator); albumentations steps draw from it and a numpy Generator. Both are created once and re-seeded
    in place per sample, the numpy one only when albumentations steps exist (~40 us), instead of
    albumentations' `set_random_seed`, which builds new generators for every transform (~450 us)."""

    def __init__(self, geometry: _Geometry, steps: list, mean, std) -> None:
        self.geometry, self.steps = geometry, steps
        self.tables = [((np.arange(256) - 255.0 * m) / (255.0 * s)).astype(np.float32) for m, s in zip(mean, std)]
        self.np_rng, self.py_rng = np.random.default_rng(0), random.Random(0)
        self.uses_numpy = False
        for step in steps:
            if isinstance(step, _Albumentations):
                step.compose.set_random_state(self.np_rng, self.py_rng)
                self.uses_numpy = True

    def reseed(self, seed: int) -> None:
        self.py_rng.seed(seed)
        if self.uses_numpy:
            self.np_rng.bit_generator.state = np.random.PCG64(seed).state

    def __call__(self, image: np.ndarray, seed: int | None = None) -> torch.Tensor:
        """An RGB uint8 (H, W, 3) array -> (C, S, S) float tensor, C = len(mean) (3, or 1: grey)."""
        if seed is not None:
            self.reseed(seed)
        h, w = image.shape[:2]
        return self._run(image, self.geometry.box(w, h, self.py_rng))

    def load(self, path: str | Path, seed: int | None = None) -> torch.Tensor:
        """Decode a file and run the pipeline; a JPEG is decoded at the smallest scale its crop allows.
        Same random draws, and the same output at full scale, as `self(decode_image(path), seed)`."""
        return self.load_bytes(read_bytes(path), path, seed)

    def load_bytes(self, data: bytes, path: str | Path, seed: int | None = None) -> torch.Tensor:
        """`load` for an image already in memory (a shard's sample); `path` names it in errors."""
        if seed is not None:
            self.reseed(seed)
        if not is_complete_jpeg(data):
            return self(decode_bytes(data, path))
        w, h = jpeg_size(data, path)
        box = self.geometry.box(w, h, self.py_rng)
        r = jpeg_reduction(box[2], box[3], *self.geometry.need(box))
        img = decode_bytes(data, path, r)
        if r > 1:  # the box in the reduced image's pixels
            sx, sy = img.shape[1] / w, img.shape[0] / h
            x0, y0 = min(int(box[0] * sx), img.shape[1] - 1), min(int(box[1] * sy), img.shape[0] - 1)
            x1 = min(max(x0 + 1, round((box[0] + box[2]) * sx)), img.shape[1])
            y1 = min(max(y0 + 1, round((box[1] + box[3]) * sy)), img.shape[0])
            box = (x0, y0, x1 - x0, y1 - y0)
        elif img.shape[:2] != (h, w):  # header and pixels disagree (PIL fallback): trust the pixels
            box = self.geometry.box(img.shape[1], img.shape[0], self.py_rng)
        return self._run(img, box)

    def _run(self, img: np.ndarray, box) -> torch.Tensor:
        img = self.geometry(img, box)
        lut = None
        for step in self.steps:
            if lut is not None:
                img, lut = cv2.LUT(img, lut, dst=img), None
            if isinstance(step, _ColorJitter):
                img, lut = step(img, self.py_rng)
            else:
                img = step(img, self.py_rng)
        return self._normalize(img, lut)

    def _normalize(self, img: np.ndarray, lut: np.ndarray | None) -> torch.Tensor:
        if len(self.tables) == 1 and img.ndim == 3 and img.shape[2] == 3:  # a 1-channel model (model.in_chans=1)
            if lut is not None:
                img, lut = cv2.LUT(img, lut), None
            img = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)  # ITU-R 601 luma (GRAY); a grey RGB image is unchanged
        planes = cv2.split(img)
        if len(planes) != len(self.tables):
            raise ValueError(f"image has {len(planes)} channels, the normalization expects {len(self.tables)}.")
        dst = np.empty((len(planes), *img.shape[:2]), dtype=np.float32)
        for c, plane in enumerate(planes):
            table = self.tables[c] if lut is None else self.tables[c][lut]
            cv2.LUT(plane, table.reshape(1, 256), dst=dst[c])
        return torch.from_numpy(dst)


def build_transform(aug: AugConfig, img_size: int, train: bool, geometry=None) -> Pipeline:
    """The pipeline for one split; input RGB uint8 (H, W, 3), output float tensor (C, S, S) with one channel
    per value of aug.mean (3 for RGB, 1 for a grey model: model.in_chans=1). `geometry`: a first step in place of
    the crop and resize (box, need, __call__ as `_Geometry`; NaFlex's whole-image resize, vit/data/naflex.py)."""
    aug = aug.resolved()  # preprocessing left unset: the fallbacks (train.py resolves it from the weights first)
    interp = cv2.INTER_CUBIC if aug.interpolation == "bicubic" else cv2.INTER_LINEAR
    if not train:
        resize = int(round(img_size / aug.eval_crop_pct))
        return Pipeline(geometry or _ResizeCenterCrop(img_size, resize, interp), [], aug.mean, aug.std)
    if geometry is None:
        geometry = _RandomResizedCrop(img_size, aug.scale, aug.ratio, interp) if aug.random_resized_crop \
            else _Geometry(img_size, interp)
    import albumentations as A  # training only: evaluate, predict and export never pay its ~1 s import

    steps: list = []
    albu: list = []

    def flush():
        if albu:
            steps.append(_Albumentations(list(albu)))
            albu.clear()

    if aug.affine_translate or aug.affine_rotate or aug.affine_scale:
        albu.append(A.Affine(
            scale=(1 - aug.affine_scale, 1 + aug.affine_scale),
            translate_percent=(-aug.affine_translate, aug.affine_translate),
            rotate=(-aug.affine_rotate, aug.affine_rotate),
            interpolation=cv2.INTER_LINEAR, p=1.0,
        ))
    if aug.hflip:
        flush()
        steps.append(_Flip(aug.hflip))
    if aug.color_jitter:
        flush()
        j = aug.color_jitter
        steps.append(_ColorJitter(j, j, j, p=0.8))
    if aug.rand_augment_ops:
        albu.append(_rand_augment(aug.rand_augment_ops))
    if aug.random_erasing:
        # filled with the mean colour: zero after normalization, as timm's 'const' random erasing
        rgb_mean = aug.mean * (3 // len(aug.mean))  # a grey model's one value, on the RGB image it erases in
        albu.append(A.Erasing(p=aug.random_erasing, fill=tuple(round(255 * m) for m in rgb_mean)))
    flush()
    return Pipeline(geometry, steps, aug.mean, aug.std)
