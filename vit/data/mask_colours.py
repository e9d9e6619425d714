"""The colours a class mask is drawn in, numpy only (the torch-free predictor draws its masks with them too): a
palette with black for class 0 (background) and well-separated hues after it, and the image with every class but
the background tinted over it."""

from __future__ import annotations

import numpy as np

__all__ = ["class_palette", "tint_mask"]


def class_palette(n: int) -> np.ndarray:
    """(n, 3) uint8 colours: black for class 0 (background), then well-separated hues (golden-ratio steps)."""
    import colorsys

    hues = [colorsys.hsv_to_rgb((0.61803 * i) % 1.0, 0.85, 1.0) for i in range(max(n - 1, 0))]
    return np.array([(0, 0, 0), *[tuple(int(255 * c) for c in h) for h in hues]], np.uint8)[:n]


def tint_mask(image: np.ndarray, mask: np.ndarray, palette: np.ndarray, alpha: float = 0.5) -> np.ndarray:
    """An RGB uint8 (H, W, 3) image with each pixel of a class other than 0 blended with its colour by `alpha`."""
    tint = palette[mask].astype(np.float64)
    blend = np.where(mask[..., None] > 0, (1 - alpha) * image + alpha * tint, image)
    return np.clip(blend, 0, 255).astype(np.uint8)
