"""Every generated image: noise whose mean colour encodes its class (`data.dataset: synthetic`, learnable in a
few steps, for smoke runs), noise with the statistics of photographs (benchmarks, export checks, tests), and
textured parts with scratches, dents and stains for anomaly detection (`inspection_part`), and wide line-scan strips
with small defects near their ends (`wide_strip`, for NaFlex against a square resize: scripts/naflex_strips.py).

Natural photographs have an amplitude spectrum close to 1/f (Field, 1987, "Relations between the statistics of
natural images and the response properties of cortical cells"); noise with that spectrum decodes, compresses
and resizes like a photo of the same size, which a flat or white-noise image does not (a smooth image decodes
2-3x faster, white noise compresses far worse). No photos need to ship with the code.
"""

from __future__ import annotations

import numpy as np

__all__ = ["photo_like", "colour_coded", "SHAPES", "shapes_image", "long_tailed_colours", "DEFECTS", "PART_KINDS",
           "inspection_part", "STRIP_DEFECTS", "wide_strip"]

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


DEFECTS = ("scratch", "dent", "stain")  # what an inspection line rejects; only ever in test images
PART_KINDS = ("brushed", "grain", "weave", "knurl")  # surface textures, each a class for training a backbone


def inspection_part(rng: np.random.Generator, size: int = 64, kind: str = "brushed", defect: str | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """A textured part as an RGB uint8 (size, size, 3) image and the defect's mask (size, size) bool (all False
    for a good part). The texture (`kind` from PART_KINDS, random phase, orientation jitter and brightness) is
    drawn first and the defect after it, so the same generator state gives the same part with or without it:
    a scratch (a thin bright or dark line), a dent (a disc shaded light on one side, dark on the other) or a
    stain (a soft dark-brown blob). Defects cover about 1-4% of the image."""
    yy, xx = np.mgrid[:size, :size].astype(np.float64) / size
    angle = rng.normal(0, 0.08)
    u = xx * np.cos(angle) + yy * np.sin(angle)
    v = -xx * np.sin(angle) + yy * np.cos(angle)
    phase = rng.uniform(0, 2 * np.pi, 2)
    if kind == "brushed":  # fine streaks along one direction
        tex = 0.6 * np.sin(2 * np.pi * 24 * v + phase[0]) + 0.4 * np.sin(2 * np.pi * 41 * v + phase[1])
        tex = tex + 0.5 * rng.normal(size=(size, 1))  # streaks vary row to row
    elif kind == "grain":  # isotropic fine grain
        tex = (photo_like(rng, size, size, slope=0.6, contrast=30)[..., 0].astype(np.float64) - 128) / 30
    elif kind == "weave":  # a checked weave
        tex = np.sin(2 * np.pi * 8 * u + phase[0]) * np.sin(2 * np.pi * 8 * v + phase[1])
    elif kind == "knurl":  # diagonal cross-hatch
        tex = np.sin(2 * np.pi * 10 * (u + v) + phase[0]) + np.sin(2 * np.pi * 10 * (u - v) + phase[1])
    else:
        raise ValueError(f"unknown part kind {kind!r}; choose from {', '.join(PART_KINDS)}.")
    base = rng.uniform(110, 150)
    grey = base + 18 * tex + rng.normal(0, 4, size=(size, size))
    img = np.repeat(grey[..., None], 3, axis=2) * np.array([1.0, 1.0, 1.05])  # a faint blue steel tint
    mask = np.zeros((size, size), bool)
    if defect is not None:
        cy, cx = rng.uniform(0.25, 0.75, 2)
        if defect == "scratch":
            theta, length = rng.uniform(0, np.pi), rng.uniform(0.2, 0.35)
            t = (xx - cx) * np.cos(theta) + (yy - cy) * np.sin(theta)  # along the scratch
            d = -(xx - cx) * np.sin(theta) + (yy - cy) * np.cos(theta)  # across it
            mask = (np.abs(t) <= length / 2) & (np.abs(d) <= 0.9 / size)
            img[mask] = rng.choice([235.0, 25.0])
        elif defect == "dent":
            r = rng.uniform(0.06, 0.09)
            dy, dx = yy - cy, xx - cx
            mask = dy**2 + dx**2 <= r * r
            shade = (dx + dy) / (r * np.sqrt(2))  # -1 .. 1 across the dent: lit on one side, shadowed on the other
            img[mask] += 70 * shade[mask][:, None]
        elif defect == "stain":
            ry, rx = rng.uniform(0.05, 0.09, 2)
            e = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2
            alpha = np.clip(1.2 - e, 0, 1)[..., None] * 0.8  # soft edge
            mask = alpha[..., 0] > 0
            img = (1 - alpha) * img + alpha * np.array([70.0, 50.0, 30.0])
        else:
            raise ValueError(f"unknown defect {defect!r}; choose from {', '.join(DEFECTS)}.")
    return np.clip(img, 0, 255).astype(np.uint8), mask


STRIP_DEFECTS = ("crack", "pits")  # the defect classes of `wide_strip` (and "good": none)


def wide_strip(rng: np.random.Generator, width: int = 192, height: int = 48, defect: str | None = None
               ) -> np.ndarray:
    """A line-scan strip as an RGB uint8 (height, width, 3) image: brushed steel streaked along the strip, and
    `defect` within the outer 12% of one end, where a square centre crop cuts it away and a squash to a square
    thins it: a crack (a dark line 1 px wide across 40-70% of the height, within 15 degrees of vertical) or pits
    (three dark dots of radius 1.5 px in a short horizontal row). None: a good strip."""
    yy, xx = np.mgrid[:height, :width].astype(np.float64)
    phase = rng.uniform(0, 2 * np.pi, 2)
    tex = 0.6 * np.sin(2 * np.pi * yy / rng.uniform(3, 6) + phase[0]) + 0.4 * np.sin(2 * np.pi * yy / 7 + phase[1])
    grey = rng.uniform(110, 150) + 16 * tex + 10 * rng.normal(size=(height, 1)) + rng.normal(0, 5, (height, width))
    img = np.repeat(grey[..., None], 3, axis=2) * np.array([1.0, 1.0, 1.05])
    if defect is not None:
        end = rng.uniform(0.02, 0.12) * width
        cx, cy = (end if rng.random() < 0.5 else width - 1 - end), rng.uniform(0.3, 0.7) * height
        if defect == "crack":
            tilt, half = np.tan(np.radians(rng.uniform(-15, 15))), rng.uniform(0.2, 0.35) * height
            mask = (np.abs(xx - cx - tilt * (yy - cy)) <= 0.5) & (np.abs(yy - cy) <= half)
        elif defect == "pits":
            mask = np.zeros((height, width), bool)
            for k in (-1, 0, 1):
                mask |= (xx - cx - 5 * k) ** 2 + (yy - cy) ** 2 <= 1.5 ** 2
        else:
            raise ValueError(f"unknown strip defect {defect!r}; choose from {', '.join(STRIP_DEFECTS)}.")
        img[mask] = rng.uniform(20, 50)
    return np.clip(img, 0, 255).astype(np.uint8)
