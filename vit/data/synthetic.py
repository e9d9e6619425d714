"""Every generated image: noise whose mean colour encodes its class (`data.dataset: synthetic`, learnable in a
few steps, for smoke runs), and noise with the statistics of photographs (benchmarks, export checks, tests).

Natural photographs have an amplitude spectrum close to 1/f (Field, 1987, "Relations between the statistics of
natural images and the response properties of cortical cells"); noise with that spectrum decodes, compresses
and resizes like a photo of the same size, which a flat or white-noise image does not (a smooth image decodes
2-3x faster, white noise compresses far worse). No photos need to ship with the code.
"""

from __future__ import annotations

import numpy as np

__all__ = ["photo_like", "colour_coded"]


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
