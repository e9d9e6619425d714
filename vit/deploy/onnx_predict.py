"""Classify images with an exported model and nothing of PyTorch: ONNX Runtime and the reference preprocessing.

    clf = OnnxClassifier("exported/model.onnx")            # preprocessing.json beside it
    probs, ok, reasons = clf.predict(paths, batch_size=32)  # (N, C) float32; rows of unreadable files are NaN

The label names, input size, mean, std and every preprocessing step come from the preprocessing.json that
export.py writes next to the model (vit/deploy/preprocess.py reads it). Imports numpy, Pillow, OpenCV and
onnxruntime only: `predict.py --onnx` runs where torch is not installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .preprocess import ReferencePreprocessing

__all__ = ["OnnxClassifier", "softmax"]


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row softmax in float64, returned as float32 (what torch's float32 softmax gives, within 1e-7)."""
    z = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


class OnnxClassifier:
    def __init__(self, model: str | Path, preprocessing: str | Path | None = None, threads: int = 0) -> None:
        import onnxruntime as ort

        model = Path(model)
        pre = Path(preprocessing) if preprocessing else model.parent / "preprocessing.json"
        if not model.is_file():
            raise FileNotFoundError(f"{model} does not exist; pass the model.onnx export.py wrote.")
        if not pre.is_file():
            raise FileNotFoundError(f"{pre} does not exist; keep the preprocessing.json export.py wrote beside "
                                    f"{model.name} (or pass --preprocessing).")
        try:
            self.info = json.loads(pre.read_text())
            self.preprocess = ReferencePreprocessing.from_dict(self.info)
            self.classes = [str(c) for c in self.info["label_names"]]
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise ValueError(f"{pre} is not a preprocessing.json export.py wrote ({e!r}); export the model "
                             "again.") from None
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        opts.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime's own errors (not a model, truncated file)
            raise ValueError(f"ONNX Runtime cannot load {model}: {str(e).splitlines()[0]}") from None
        self.input = self.session.get_inputs()[0].name

    def predict(self, paths: list[Path], batch_size: int = 32) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """-> probabilities (N, C) float32, readable (N,) bool, and the reason for each unreadable file ('')."""
        n = len(paths)
        probs = np.full((n, len(self.classes)), np.nan, dtype=np.float32)
        ok = np.zeros(n, dtype=bool)
        reasons = [""] * n
        for start in range(0, n, batch_size):
            xs, idx = [], []
            for i in range(start, min(n, start + batch_size)):
                try:
                    xs.append(self.preprocess.load(paths[i]))
                    idx.append(i)
                except (OSError, ValueError, SyntaxError, cv2_error()) as e:
                    reasons[i] = f"cannot decode image {paths[i]}: {e}"
            if xs:
                logits = self.session.run(None, {self.input: np.stack(xs)})[0]
                probs[idx], ok[idx] = softmax(logits), True
        return probs, ok, reasons


def cv2_error():
    import cv2

    return cv2.error
