"""predict.py for a segmentation checkpoint: per image a mask PNG (palette: one colour per class), an overlay (the
classes other than the first, background, tinted over the image) and a row with each class's area.

An image no larger than the model's input (`model.img_size`) is resized to it and its logits resized back; a larger
one (a wide line-scan strip) is read at its own scale in sliding windows of `window` pixels (`seg.window`, default
the input size), overlapping logits averaged (vit/eval/segmentation.py: sliding_logits), so a defect a few pixels
wide is not shrunk away.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..data.decode import BadImageError, decode_image
from ..eval.segmentation import sliding_logits
from ..utils.atomic import atomic_write_bytes, atomic_write_csv

__all__ = ["class_palette", "segment_image", "predict_seg_images"]


def class_palette(n: int) -> np.ndarray:
    """(n, 3) uint8 colours: black for class 0 (background), then well-separated hues."""
    import colorsys

    hues = [colorsys.hsv_to_rgb((0.61803 * i) % 1.0, 0.85, 1.0) for i in range(max(n - 1, 0))]
    return np.array([(0, 0, 0), *[tuple(int(255 * c) for c in h) for h in hues]], np.uint8)[:n]


@torch.no_grad()
def segment_image(model, image: np.ndarray, img_size: int, mean, std, window: int | None = None) -> np.ndarray:
    """(H, W) int64 classes of an RGB uint8 (H, W, 3) image (module docstring: resize, or sliding windows)."""
    x = torch.from_numpy(np.array(image)).permute(2, 0, 1)[None].float() / 255.0  # a writable copy
    x = (x - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]  # (1, 3, H, W)
    H, W = image.shape[:2]
    if max(H, W) > img_size:
        logits = sliding_logits(model, x, window or img_size)
    else:
        small = F.interpolate(x, size=(img_size, img_size), mode="bilinear", align_corners=False)
        logits = F.interpolate(model(small), size=(H, W), mode="bilinear", align_corners=False)
    return logits.argmax(1)[0]


def _png(array: np.ndarray, palette: np.ndarray | None = None) -> bytes:
    import io

    from PIL import Image

    img = Image.fromarray(array, "P" if palette is not None else "RGB")
    if palette is not None:
        img.putpalette(palette.ravel().tolist())
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def predict_seg_images(model, cfg, classes: list[str], paths: list[Path], out_dir: Path,
                       alpha: float = 0.5) -> tuple[list[dict], list[tuple[str, str]]]:
    """Masks in out_dir/masks/, overlays in out_dir/overlays/ (named <index>_<stem>.png), and segmentation.csv:
    per image its size and, per class but the first, the area in pixels and in percent. Returns (rows, skipped:
    (path, why) for files that are not readable images)."""
    model.eval()
    out_dir = Path(out_dir)
    palette, rows, skipped = class_palette(len(classes)), [], []
    mean, std = cfg.aug.mean or [0.5] * 3, cfg.aug.std or [0.5] * 3
    for i, path in enumerate(paths):
        try:
            image = decode_image(path)
        except (BadImageError, ValueError, OSError) as e:
            skipped.append((str(path), str(e).splitlines()[0] if str(e) else "not readable as an image"))
            continue
        mask = segment_image(model, image, cfg.model.img_size, mean, std, cfg.seg.window).numpy().astype(np.uint8)
        name = f"{i:04d}_{Path(path).stem}.png"
        atomic_write_bytes(out_dir / "masks" / name, _png(mask, palette))
        tint = palette[mask].astype(np.float64)
        blend = np.where(mask[..., None] > 0, (1 - alpha) * image + alpha * tint, image)
        atomic_write_bytes(out_dir / "overlays" / name, _png(np.clip(blend, 0, 255).astype(np.uint8)))
        counts = np.bincount(mask.ravel(), minlength=len(classes))
        row = {"path": str(path), "mask": f"masks/{name}", "width": image.shape[1], "height": image.shape[0]}
        for c, name_c in enumerate(classes[1:], start=1):
            row[f"area_px_{name_c}"] = int(counts[c])
            row[f"area_pct_{name_c}"] = round(100.0 * counts[c] / mask.size, 4)
        rows.append(row)
    if rows:
        atomic_write_csv(out_dir / "segmentation.csv", list(rows[0]), rows)
    if skipped:
        atomic_write_csv(out_dir / "skipped.csv", ["path", "reason"], [{"path": p, "reason": r} for p, r in skipped])
    return rows, skipped
