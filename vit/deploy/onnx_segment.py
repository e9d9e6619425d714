"""A segmentation model exported to ONNX, and its torch-free predictor.

`export_segmenter` (PyTorch) writes segmenter.onnx (images (B, 3, S, S) -> logits (B, C, S, S), the batch
dynamic) and segmentation.json (input size, mean, std, classes, window), then checks ONNX Runtime's logits against
the eager model's on the given batches (within `atol`) and that every pixel's argmax agrees.

`OnnxSegmenter` (numpy, Pillow and onnxruntime only) reads them back and segments an RGB uint8 image as
vit/deploy/seg_predict.py does: an image of the input size as it is, a larger one in sliding windows (the same
windows, overlapping logits averaged), a smaller one resized (OpenCV's bilinear, so its masks may differ from
PyTorch's at a few boundary pixels).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..utils.atomic import atomic_write_text
from .session import open_session

__all__ = ["SEGMENTER_ONNX", "SEGMENTER_INT8", "SEG_SETTINGS", "window_starts", "export_segmenter", "settings_problem",
           "OnnxSegmenter"]

SEGMENTER_ONNX, SEGMENTER_INT8, SEG_SETTINGS = "segmenter.onnx", "segmenter.int8.onnx", "segmentation.json"


def window_starts(size: int, window: int, stride: int) -> list[int]:
    """Window offsets along a side of `size` pixels: every `stride`, the last flush with the edge."""
    if size <= window:
        return [0]
    starts = list(range(0, size - window + 1, stride))
    return starts + ([size - window] if starts[-1] != size - window else [])


def export_segmenter(model, out_dir: str | Path, cfg, classes: list[str], batches: list, atol: float = 1e-4) -> dict:
    """segmenter.onnx + segmentation.json in `out_dir`, checked on `batches` (module docstring) -> the check's
    numbers (largest logit difference, pixels whose class differs)."""
    import torch

    from .export import ONNX_OPSET, ExportError, require_onnx

    require_onnx()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = model.eval()
    example = batches[0] if len(batches[0]) > 1 else batches[0].repeat(2, 1, 1, 1)  # size 1 would be frozen
    batch = torch.export.Dim("batch", min=1, max=1024)
    with torch.no_grad():
        program = torch.onnx.export(model, (example,), dynamo=True, dynamic_shapes={"x": {0: batch}},
                                    input_names=["x"], output_names=["logits"], opset_version=ONNX_OPSET,
                                    verbose=False)
    program.save(str(out / SEGMENTER_ONNX))
    settings = dict(img_size=cfg.model.img_size, mean=list(cfg.aug.mean), std=list(cfg.aug.std), classes=classes,
                    window=cfg.seg.window or cfg.model.img_size, output="logits (B, C, S, S); class = argmax over C")
    atomic_write_text(out / SEG_SETTINGS, json.dumps(settings, indent=1))
    session = open_session(out / SEGMENTER_ONNX)
    worst, differ = 0.0, 0
    for x in batches:
        with torch.no_grad():
            want = model(x).numpy()
        got = session.run(None, {"x": x.numpy()})[0]
        worst = max(worst, float(np.abs(got - want).max()))
        differ += int((got.argmax(1) != want.argmax(1)).sum())
    if worst > atol:
        raise ExportError(f"the ONNX segmenter's logits differ from PyTorch's by {worst:.2e} (> {atol:g}); it was not "
                          "kept as verified.")
    return {"max_abs_logit_diff": worst, "pixels_differing": differ}


def settings_problem(s) -> str | None:
    """What is wrong with a segmentation.json's values (one phrase), or None."""
    if not isinstance(s, dict):
        return f"expected a JSON object, got {type(s).__name__}"
    missing = [k for k in ("img_size", "mean", "std", "classes", "window") if k not in s]
    if missing:
        return f"the key {missing[0]!r} is missing"
    size = s["img_size"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        return f"img_size must be a positive integer, got {size!r}"
    if s["window"] != size:
        return f"window must be the input size {size} (the exported model takes no other), got {s['window']!r}"
    for key in ("mean", "std"):
        v = s[key]
        if not (isinstance(v, list) and len(v) == 3 and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                           and np.isfinite(x) for x in v)):
            return f"{key} must be a list of 3 finite numbers (RGB), got {v!r}"
    if min(s["std"]) <= 0:
        return f"std must be positive, got {s['std']!r}"
    c = s["classes"]
    if not (isinstance(c, list) and c and all(isinstance(x, str) and x for x in c) and len(set(c)) == len(c)):
        return f"classes must be a list of distinct, non-empty names, got {c!r}"
    return None


class OnnxSegmenter:
    """An exported segmenter (module docstring): `segment(image)` -> (H, W) int64 classes. `file`: segmenter.onnx
    or its INT8 form, segmenter.int8.onnx (export.py --quantize int8)."""

    def __init__(self, folder: str | Path, file: str = SEGMENTER_ONNX) -> None:
        folder = Path(folder)
        path, redo = folder / SEG_SETTINGS, "export the segmenter again with export.py"
        if not path.is_file():
            raise ValueError(f"{folder} has no {SEG_SETTINGS} beside {file}; {redo}.")
        try:
            self.settings = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise ValueError(f"{path} is not readable JSON ({str(e).splitlines()[0]}); {redo}.") from None
        problem = settings_problem(self.settings)
        if problem:
            raise ValueError(f"{path}: {problem}; {redo}.")
        self.session = open_session(folder / file)
        self.size, self.classes = int(self.settings["img_size"]), list(self.settings["classes"])
        self.mean = np.asarray(self.settings["mean"], np.float32)[:, None, None]
        self.std = np.asarray(self.settings["std"], np.float32)[:, None, None]
        side = self.session.get_inputs()[0].shape[2:]  # (S, S): the export fixes the size, the batch is dynamic
        if all(isinstance(d, int) for d in side) and list(side) != [self.size, self.size]:
            raise ValueError(f"{path} says img_size {self.size}, and {file} takes {side[0]}x{side[1]} images; {redo}.")
        channels = self.logits(np.zeros((1, len(self.mean), self.size, self.size), np.float32)).shape[1]
        if channels != len(self.classes):
            raise ValueError(f"{path} names {len(self.classes)} classes, and {file} scores {channels}; {redo}.")

    def logits(self, x: np.ndarray) -> np.ndarray:
        """(1, 3, S, S) float32 normalised -> (1, C, S, S)."""
        return self.session.run(None, {"x": x})[0]

    def segment(self, image: np.ndarray) -> np.ndarray:
        x = (image.transpose(2, 0, 1).astype(np.float32) / 255.0 - self.mean) / self.std  # (3, H, W)
        H, W = image.shape[:2]
        S = self.size
        if max(H, W) <= S:
            import cv2

            small = cv2.resize(x.transpose(1, 2, 0), (S, S), interpolation=cv2.INTER_LINEAR).transpose(2, 0, 1)
            out = self.logits(small[None])[0].transpose(1, 2, 0)  # (S, S, C)
            return cv2.resize(out, (W, H), interpolation=cv2.INTER_LINEAR).argmax(-1)
        window = int(self.settings["window"])
        xp = np.pad(x, ((0, 0), (0, max(0, window - H)), (0, max(0, window - W))))
        Hp, Wp = xp.shape[1:]
        total, count = None, np.zeros((Hp, Wp), np.float32)
        for top in window_starts(Hp, window, max(1, window // 2)):
            for left in window_starts(Wp, window, max(1, window // 2)):
                out = self.logits(np.ascontiguousarray(xp[None, :, top:top + window, left:left + window]))[0]
                total = np.zeros((out.shape[0], Hp, Wp), np.float32) if total is None else total
                total[:, top:top + window, left:left + window] += out
                count[top:top + window, left:left + window] += 1
        return (total / count)[:, :H, :W].argmax(0)
