"""Every generated image: noise whose mean colour encodes its class (`data.dataset: synthetic`, learnable in a
few steps, for smoke runs), and noise with the statistics of photographs (benchmarks, export checks, tests).

Natural photographs have an amplitude spectrum close to 1/f (Field, 1987, "Relations between the statistics of
natural images and the response properties of cortical cells"); noise with that spectrum decodes, compresses
and resizes like a photo of the same size, which a flat or white-noise image does not (a smooth image decodes
2-3x faster, white noise compresses far worse). No photos need to ship with the code.
"""

from __future__ import annotations

import numpy as np

__all__ = ["photo_like", "colour_coded", "SHAPES", "shapes_image", "long_tailed_colours"]

SHAPES = ("disc", "square", "triangle", "bar")  # each drawn in its own colour, so position never decides
_SHAPE_COLOURS = {"disc": (230, 40, 40), "square": (40, 200, 60), "triangle": (50, 80, 230), "bar": (230, 210, 40)}


def photo_like(rng: np.random.Generator, width: int, height: int, slope: float = 1.0,
               contrast: float = 50.0) -> np.ndarray:
    """An RGB uint8 (height, width, 3) image with the power-law spectrum of natural photographs: amplitude
    ~ 1/f**slope (1 is typical of photos; larger is smoother), grey levels 128 +- `contrast` (one std). For
    benchmarks and tests that need photo-like detail and JPEG sizes without shipping photos."""
    fy, fx = np.fft.fftfreq(height)[:, None], np.fft.rfftfreq(width)[None, :]
    f = np.hypot(fx, fy)
    f[0, 0] = 1.0
    spec = (rng.normal(size=(3, *f.shape)) + 1j * rng.normal(size=(3, *f.shape))) / f**slope
    a = np.fft.irfft2(spec, s=(height, width)).transpose(1, 2, 0)  # (H, W, 3)
    return np.ascontiguousarray(np.clip((a - a.mean()) / a.std() * contrast + 128, 0, 255).astype(np.uint8))


def colour_coded(seed: int, num_classes: int, sizes: tuple[int, ...],
                 img_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """One (images (n, img_size, img_size, 3) uint8, labels (n,)) pair per n in `sizes`: Gaussian noise (std 40)
    around a random colour per class, so the class is the mean colour. One generator, seeded once and drawn in
    order (the palette, then each split), so the same seed gives the same splits."""
    rng = np.random.default_rng(seed)
    palette = rng.integers(0, 256, size=(num_classes, 3))
    out = []
    for n in sizes:
        y = rng.integers(0, num_classes, size=n)
        noise = rng.normal(0, 40, size=(n, img_size, img_size, 3))
        out.append((np.clip(palette[y][:, None, None, :] + noise, 0, 255).astype(np.uint8), y))
    return out


def shapes_image(rng: np.random.Generator, size: int = 32, max_shapes: int = 3) -> tuple[np.ndarray, list[str]]:
    """An RGB uint8 (size, size, 3) image of 1..`max_shapes` different shapes from SHAPES at random places on a
    dark noisy background, and the names of the shapes drawn: a multi-label sample (label = which shapes)."""
    k = int(rng.integers(1, max_shapes + 1))
    names = sorted(rng.choice(SHAPES, size=k, replace=False).tolist())
    img = rng.normal(40, 12, size=(size, size, 3))
    yy, xx = np.mgrid[:size, :size]
    r = size // 5  # shapes about a fifth of the image across: a 16-pixel patch sees most of one
    for name in names:
        cy, cx = rng.integers(r, size - r, size=2)
        dy, dx = yy - cy, xx - cx
        mask = {"disc": dy**2 + dx**2 <= r * r,
                "square": (abs(dy) <= r * 0.8) & (abs(dx) <= r * 0.8),
                "triangle": (dy <= r) & (dy >= -r) & (abs(dx) <= (dy + r) / 2),
                "bar": (abs(dy) <= max(1, r // 3)) & (abs(dx) <= r * 1.4)}[name]
        img[mask] = _SHAPE_COLOURS[name]
    return np.clip(img, 0, 255).astype(np.uint8), names


def long_tailed_colours(rng: np.random.Generator, counts: list[int], size: int = 32,
                        jitter: float = 30.0) -> tuple[np.ndarray, np.ndarray]:
    """A class-imbalanced set: counts[c] RGB uint8 (size, size, 3) images of class c. An image's brightness is
    its class's (evenly spaced, 45 levels apart for 4 classes) plus a per-image offset of std `jitter`, so that
    neighbouring classes overlap; returns (images (N, size, size, 3), labels (N,)). A model trained on it
    without balancing favours the frequent classes where they overlap the rare ones."""
    k = len(counts)
    centres = np.linspace(60, 195, k)  # brightness of each class
    labels = np.repeat(np.arange(k), counts)
    level = centres[labels] + rng.normal(0, jitter, size=len(labels))  # (N,) overlapping between neighbours
    tint = np.array([1.0, 0.8, 0.6])  # a colour, not grey, so that the RGB pipeline has something to see
    imgs = level[:, None, None, None] * tint + rng.normal(0, 10, size=(len(labels), size, size, 3))
    return np.clip(imgs, 0, 255).astype(np.uint8), labels
