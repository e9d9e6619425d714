"""What predict.py writes for a segmentation model, torch-free (the PyTorch model's predictor,
vit/deploy/seg_predict.py, and the ONNX one, vit/deploy/onnx_segment.py, hand it their `segment` function): per
image a mask PNG (a palette PNG, one colour per class, class 0 black), an overlay (the classes other than the first
tinted over the image) and a row of segmentation.csv with each class's area in pixels and percent."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..data.decode import BadImageError, decode_image
from ..data.mask_colours import class_palette, tint_mask
from ..utils.atomic import atomic_write_bytes, atomic_write_csv

__all__ = ["class_palette", "write_seg_outputs"]


def _png(array: np.ndarray, palette: np.ndarray | None = None) -> bytes:
    import io

    from PIL import Image

    img = Image.fromarray(array, "P" if palette is not None else "RGB")
    if palette is not None:
        img.putpalette(palette.ravel().tolist())
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def write_seg_outputs(segment: Callable[[np.ndarray], np.ndarray], classes: list[str], paths: list[Path],
                      out_dir: Path, alpha: float = 0.5, skipped: Sequence[tuple[str, str]] = ()) -> tuple[
                          list[dict], list[tuple[str, str]]]:
    """`segment(image)`: an RGB uint8 (H, W, 3) image -> its (H, W) classes. Masks in out_dir/masks/, overlays in
    out_dir/overlays/ (named <index>_<stem>.png), segmentation.csv (skipped.csv for files that are not readable
    images, after `skipped`: the inputs refused before, e.g. not image files). Returns (rows, every skipped
    (path, why))."""
    out_dir = Path(out_dir)
    palette, rows, skipped = class_palette(len(classes)), [], list(skipped)
    for i, path in enumerate(paths):
        try:
            image = decode_image(path)
        except (BadImageError, ValueError, OSError) as e:
            skipped.append((str(path), str(e).splitlines()[0] if str(e) else "not readable as an image"))
            continue
        mask = np.asarray(segment(image)).astype(np.uint8)
        name = f"{i:04d}_{Path(path).stem}.png"
        atomic_write_bytes(out_dir / "masks" / name, _png(mask, palette))
        atomic_write_bytes(out_dir / "overlays" / name, _png(tint_mask(image, mask, palette, alpha)))
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
