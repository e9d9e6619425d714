"""predict.py for a segmentation checkpoint: per image a mask PNG (palette: one colour per class), an overlay (the
classes other than the first, background, tinted over the image) and a row with each class's area.

An image no larger than the model's input (`model.img_size`) is resized to it and its logits resized back; a larger
one (a wide line-scan strip) is read at its own scale in sliding windows of `window` pixels (`seg.window`, default
the input size), overlapping logits averaged (vit/eval/segmentation.py: sliding_logits), so a defect a few pixels
wide is not shrunk away.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..eval.segmentation import naflex_budget, segment_image
from .seg_outputs import class_palette, write_seg_outputs

__all__ = ["class_palette", "segment_image", "predict_seg_images"]


def predict_seg_images(model, cfg, classes: list[str], paths: list[Path], out_dir: Path, alpha: float = 0.5,
                       skipped: Sequence[tuple[str, str]] = ()) -> tuple[list[dict], list[tuple[str, str]]]:
    """Masks in out_dir/masks/, overlays in out_dir/overlays/ (named <index>_<stem>.png), and segmentation.csv:
    per image its size and, per class but the first, the area in pixels and in percent
    (vit/deploy/seg_outputs.py). Returns (rows, skipped: (path, why) for files that are not readable images)."""
    model.eval()
    mean, std = cfg.aug.mean or [0.5] * 3, cfg.aug.std or [0.5] * 3

    def segment(image: np.ndarray) -> np.ndarray:
        return segment_image(model, image, cfg.model.img_size, mean, std, cfg.seg.window, naflex_budget(cfg)).numpy()

    return write_seg_outputs(segment, classes, paths, out_dir, alpha, skipped)
