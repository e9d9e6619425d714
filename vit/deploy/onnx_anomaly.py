"""Score images for anomalies with an exported PatchCore and nothing of PyTorch: ONNX Runtime for the patch
features, NumPy for the nearest-neighbour distance to the bank.

    pc = OnnxPatchCore("exported/anomaly")           # features.onnx, bank.npy, patchcore.json in it
    scores, maps, ok, reasons = pc.predict(paths)    # (N,) and (N, h, w) float64; NaN where a file is unreadable
    pc.threshold                                     # a score at or above it is a defect (None: no verdict)

export.py writes the folder beside model.onnx when the checkpoint holds a bank (vit/deploy/export.py:
`export_patchcore`): features.onnx, a separate model from images (B, C, S, S) to patch features (B, h*w, F) (the
blocks' tokens, neighbourhood-averaged: `vit.eval.anomaly.PatchFeatures`); bank.npy, the coreset (K, F) float32,
read with allow_pickle=False (a plain array, never a pickle); patchcore.json, the threshold and grid. The score is
vit.eval.anomaly's: s = max_p min_m ||f_p - m||_2. Images are read by the preprocessing.json one folder up, as
onnx_predict does. `features="features.xml"` scores with the OpenVINO IR export.py --format openvino writes beside
features.onnx (vit/deploy/openvino_ir.py), on OpenVINO's CPU runtime. Imports numpy, Pillow, OpenCV and
onnxruntime (or openvino) only.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..eval.anomaly_settings import SETTINGS_FILE as SETTINGS
from ..eval.anomaly_settings import read_settings
from .onnx_predict import load_batches, regular_file
from .preprocess import ReferencePreprocessing, read_preprocessing
from .session import open_session

__all__ = ["OnnxPatchCore", "nearest_distance", "FEATURES_ONNX", "BANK_NPY"]

FEATURES_ONNX, BANK_NPY = "features.onnx", "bank.npy"  # beside SETTINGS (patchcore.json)


def nearest_distance(queries: np.ndarray, bank: np.ndarray, chunk: int = 1024) -> np.ndarray:
    """Euclidean distance of each query (M, F) to its nearest bank row (K, F) -> (M,) float64. The expansion
    |q|^2 + |m|^2 - 2 q.m in float64: its cancellation error (~1e-16 |q|^2) stays far below float32's."""
    b = bank.astype(np.float64)
    b2 = (b * b).sum(1)  # (K,)
    out = []
    for i in range(0, len(queries), chunk):
        q = queries[i:i + chunk].astype(np.float64)
        d2 = (q * q).sum(1)[:, None] + b2[None, :] - 2.0 * (q @ b.T)  # (m, K)
        out.append(np.sqrt(np.maximum(d2.min(1), 0.0)))
    return np.concatenate(out) if out else np.zeros(0)


class OnnxPatchCore:
    def __init__(self, folder: str | Path, preprocessing: str | Path | None = None, threads: int = 0,
                 features: str = FEATURES_ONNX) -> None:
        folder = Path(folder)
        redo = "export the checkpoint again with export.py" + (" --format openvino" * features.endswith(".xml"))
        for name in (features, BANK_NPY, SETTINGS):
            regular_file(folder / name, f"{folder} needs {features}, {BANK_NPY} and {SETTINGS}: {redo}")
        pre = Path(preprocessing) if preprocessing else folder.parent / "preprocessing.json"
        try:
            info = read_preprocessing(pre)
            self.preprocess = ReferencePreprocessing.from_dict(info)
        except ValueError as e:
            raise ValueError(f"{pre}: {e}; {redo}.") from None
        settings = read_settings(folder / SETTINGS, redo)  # vit.eval.anomaly's checks: one reader for both paths
        size, patch = self.preprocess.size, info.get("patch_size")
        expected = (size // patch[0], size // patch[1]) if isinstance(patch, list) and len(patch) == 2 and all(
            isinstance(p, int) and 0 < p <= size for p in patch) else None
        if expected is None or settings.get("grid") != list(expected):  # before predict allocates maps of it
            raise ValueError(f"{folder / SETTINGS} has grid {settings.get('grid')!r}, but {pre}'s {size} x {size} "
                             f"images in {patch!r}-pixel patches make a {expected} grid; {redo}.")
        try:
            self.bank = np.load(folder / BANK_NPY, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise ValueError(f"{folder} does not hold an exported PatchCore ({str(e)[:120]}); {redo}.") from None
        if (self.bank.dtype != np.float32 or self.bank.ndim != 2 or not len(self.bank)
                or not np.isfinite(self.bank).all()):
            raise ValueError(f"{folder / BANK_NPY} is not a finite, non-empty (K, F) float32 bank; {redo}.")
        self.threshold, self.grid = settings["threshold"], tuple(settings["grid"])
        self.normalize, self.top_share = settings["normalize"], settings["top_share"]  # AnomalyDINO's, see below
        self.features = folder / features
        try:
            self.session = open_session(self.features, threads)
        except Exception as e:  # onnxruntime's own errors (not a model, truncated file); OpenVINO's are one already
            if self.features.suffix == ".xml":
                raise
            raise ValueError(f"ONNX Runtime cannot load {self.features}: {str(e).splitlines()[0]}") from None
        self.input = self.session.get_inputs()[0].name
        self.folder = folder
        dims = self.session.get_outputs()[0].shape  # (batch, h*w, F); symbolic where dynamic
        for dim, want, what in ((1, math.prod(self.grid), "patches"), (2, self.bank.shape[1], "features")):
            if len(dims) != 3 or isinstance(dims[dim], int) and dims[dim] != want:
                raise ValueError(f"{self.features} gives outputs {dims}, but the bank and grid need {want} "
                                 f"{what} in dimension {dim}; {redo}.")

    def score(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Preprocessed images (B, C, S, S) float32 -> (image scores (B,), patch score maps (B, h, w))."""
        feats = self.session.run(None, {self.input: x})[0]  # (B, h*w, F)
        if feats.ndim != 3 or feats.shape[2] != self.bank.shape[1] or feats.shape[1] != math.prod(self.grid):
            raise ValueError(f"{self.features} gives features {feats.shape}, but the bank holds "
                             f"{self.bank.shape[1]}-vectors on a {self.grid} grid; export the checkpoint again.")
        patch = nearest_distance(feats.reshape(-1, feats.shape[2]), self.bank).reshape(len(x), -1)
        patch = patch**2 / 2 if self.normalize else patch  # unit features (normalised in the ONNX): 1 - cos
        k = max(1, math.ceil(self.top_share * patch.shape[1] - 1e-9))  # vit.eval.anomaly.top_mean
        return -np.sort(-patch, axis=1)[:, :k].mean(1), patch.reshape(len(x), *self.grid)

    def predict(self, paths: list[Path], batch_size: int = 32) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                         list[str]]:
        """-> scores (N,), maps (N, h, w), readable (N,) bool, and the reason for each unreadable file ('')."""
        n = len(paths)
        scores, maps = np.full(n, np.nan), np.full((n, *self.grid), np.nan)
        ok, reasons = np.zeros(n, dtype=bool), [""] * n
        for idx, x in load_batches(self.preprocess, paths, batch_size, reasons):
            (scores[idx], maps[idx]), ok[idx] = self.score(x), True
        return scores, maps, ok, reasons
