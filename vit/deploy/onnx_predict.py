"""Classify images with an exported model and nothing of PyTorch: ONNX Runtime and the reference preprocessing.

    clf = OnnxClassifier("exported/model.onnx")            # preprocessing.json beside it (model.xml: OpenVINO)
    probs, ok, reasons = clf.predict(paths, batch_size=32)  # (N, C) float32; rows of unreadable files are NaN
    clf.threshold                                           # None: softmax; a multi-label model: sigmoids, >= it

The label names, input size, mean, std, every preprocessing step and the problem type come from the
preprocessing.json that export.py writes next to the model (vit/deploy/preprocess.py reads and checks it):
`problem_type` "single_label_classification" (softmax; also a file without the key) or
"multi_label_classification" (a sigmoid per class and `threshold`, the one training chose), Hugging Face's names.
The same class runs export.py's OpenVINO IR (model.xml, `--format openvino`) on OpenVINO's CPU runtime: the file's
suffix picks the runtime (vit/deploy/session.py), everything else is shared.
Imports numpy, Pillow, OpenCV and onnxruntime (or openvino) only (no torch, PyYAML or vit.config): `predict.py
--onnx` runs where only those four are installed.
"""

from __future__ import annotations

import math
import stat
from pathlib import Path

import cv2
import numpy as np

from ..data.decode import BadImageError
from .openvino_ir import require_openvino
from .preprocess import ReferencePreprocessing, read_preprocessing
from .session import open_session, runtime_name

__all__ = ["OnnxClassifier", "softmax", "sigmoid", "PROBLEM_TYPES", "load_batches", "regular_file"]

SINGLE, MULTI = "single_label_classification", "multi_label_classification"
PROBLEM_TYPES = (SINGLE, MULTI)


def softmax(logits: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Row softmax in float64, returned as `dtype` (float32: what torch's float32 softmax gives, within 1e-7)."""
    z = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(-1, keepdims=True)).astype(dtype, copy=False)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Element-wise sigmoid in float64, returned as float32 (a multi-label model's per-class probabilities)."""
    return (0.5 * (1.0 + np.tanh(0.5 * logits.astype(np.float64)))).astype(np.float32)


def _heads(info: dict) -> tuple[list[str], str, float | None]:
    """(class names, problem type, threshold or None) from preprocessing.json; ValueError naming the field."""
    names = info.get("label_names")
    if not isinstance(names, list) or not names or not all(isinstance(c, str) for c in names):
        raise ValueError(f"label_names is {str(names)[:60]}, not a list of class names")
    if len(set(names)) < len(names) or not all(c.strip() for c in names):  # predictions.csv names a class once
        raise ValueError(f"label_names {str(names)[:60]} has a repeated or blank name; each class needs its own")
    if "num_classes" in info and info["num_classes"] != len(names):
        raise ValueError(f"num_classes {info['num_classes']!r} differs from the {len(names)} label_names")
    problem = info.get("problem_type", SINGLE)  # files written before the key: single-label models
    if problem not in PROBLEM_TYPES:
        raise ValueError(f"problem_type {problem!r} is not one of {', '.join(PROBLEM_TYPES)}")
    threshold = info.get("threshold")
    if problem == SINGLE:
        if threshold is not None:
            raise ValueError("a threshold goes with problem_type multi_label_classification, not a single-label one")
        return names, problem, None
    if type(threshold) not in (int, float) or not (math.isfinite(threshold) and 0 < threshold < 1):
        raise ValueError(f"threshold is {threshold!r}, not a probability between 0 and 1")
    return names, problem, float(threshold)


def load_batches(preprocess: ReferencePreprocessing, paths: list[Path], batch_size: int, reasons: list[str]):
    """Yield (indices, images (b, C, S, S) float32) of the readable files of each run of `batch_size` paths; an
    unreadable file's sentence goes into reasons[i] instead (a broken file never stops the run)."""
    for start in range(0, len(paths), batch_size):
        xs, idx = [], []
        for i in range(start, min(len(paths), start + batch_size)):
            try:
                xs.append(preprocess.load(paths[i]))
                idx.append(i)
            except BadImageError as e:  # vit.data.decode's sentence names the file
                reasons[i] = str(e)
            except MemoryError:  # past every size check, the machine still had too little: this file only
                reasons[i] = f"cannot decode image {paths[i]}: out of memory while decoding it"
            except (OSError, ValueError, SyntaxError, cv2.error) as e:
                reasons[i] = f"cannot decode image {paths[i]}: {str(e).strip().splitlines()[-1]}"
        if xs:
            yield idx, np.stack(xs)


def regular_file(path: Path, what: str) -> None:
    """FileNotFoundError or ValueError (one sentence) unless `path` is a regular file (stat: nothing opened)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist; {what}.") from None
    except OSError as e:
        raise ValueError(f"cannot read {path} ({e.strerror or e}); {what}.") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path} is not a regular file (a folder, FIFO or device); {what}.")


class OnnxClassifier:
    def __init__(self, model: str | Path, preprocessing: str | Path | None = None, threads: int = 0) -> None:
        model = Path(model)
        if model.suffix == ".xml":
            require_openvino("predict.py --openvino")
        else:
            import onnxruntime  # noqa: F401 (not installed: the ImportError says so here, not as a load error below)
        pre = Path(preprocessing) if preprocessing else model.parent / "preprocessing.json"
        regular_file(model, f"pass the {'model.xml' if model.suffix == '.xml' else 'model.onnx'} export.py wrote")
        self.info = read_preprocessing(pre)
        try:
            self.preprocess = ReferencePreprocessing.from_dict(self.info)
            self.classes, self.problem_type, self.threshold = _heads(self.info)
        except ValueError as e:
            raise ValueError(f"{pre}: {e}; export the model again.") from None
        self.runtime = runtime_name(model)
        try:
            self.session = open_session(model, threads)
        except Exception as e:  # onnxruntime's own errors (not a model, truncated file); OpenVINO's are one already
            if model.suffix == ".xml":
                raise
            raise ValueError(f"ONNX Runtime cannot load {model}: {str(e).splitlines()[0]}") from None
        self.model, self.pre = model, pre
        x, logits = self.session.get_inputs()[0], self.session.get_outputs()[0]
        if "patch_coord" in [i.name for i in self.session.get_inputs()]:
            raise ValueError(f"{model.name} is a NaFlex export (inputs patches, patch_coord, patch_valid), which this "
                             "predictor, made for square images, cannot feed; run predict.py --checkpoint on the "
                             "NaFlex checkpoint instead.")
        self.input = x.name
        want = [len(self.preprocess.mean), self.preprocess.size, self.preprocess.size]  # (C, S, S)
        fixed = x.shape[1:] if len(x.shape) == 4 else None  # ints where the export fixed a side, else names
        if fixed is None or any(isinstance(d, int) and d != w for d, w in zip(fixed, want)):
            raise ValueError(f"{model.name} takes input {x.shape} but {pre.name} makes (N, {want[0]}, {want[1]}, "
                             f"{want[2]}); keep the preprocessing.json exported with this model.")
        self._check_outputs(logits.shape[-1] if logits.shape else None)

    def _check_outputs(self, k) -> None:
        if isinstance(k, int) and k != len(self.classes):
            raise ValueError(f"{self.model.name} gives {k} outputs per image but {self.pre.name} names "
                             f"{len(self.classes)} classes; keep the preprocessing.json exported with this model.")

    def predict(self, paths: list[Path], batch_size: int = 32) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """-> probabilities (N, C) float32 (softmax, or sigmoids for a multi-label model), readable (N,) bool, and
        the reason for each unreadable file ('')."""
        n = len(paths)
        probs = np.full((n, len(self.classes)), np.nan, dtype=np.float32)
        ok = np.zeros(n, dtype=bool)
        reasons = [""] * n
        for idx, x in load_batches(self.preprocess, paths, batch_size, reasons):
            probs[idx], ok[idx] = self.scores(x), True
        return probs, ok, reasons

    def scores(self, x: np.ndarray) -> np.ndarray:
        """Preprocessed images (B, C, S, S) float32 -> probabilities (B, num_classes) float32."""
        try:
            logits = self.session.run(None, {self.input: x})[0]
        except Exception as e:  # the runtimes' errors carry a C++ trace: its first line says what
            raise ValueError(f"{self.runtime} cannot run {self.model.name} on input {tuple(x.shape)}: "
                             f"{str(e).strip().splitlines()[0][:300]}") from None
        if logits.ndim != 2:
            raise ValueError(f"{self.model.name} gives outputs of shape {logits.shape}, not (N, classes); export "
                             "the model with export.py.")
        self._check_outputs(logits.shape[1])
        return sigmoid(logits) if self.threshold is not None else softmax(logits)

