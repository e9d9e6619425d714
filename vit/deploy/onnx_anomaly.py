"""Score images for anomalies with an exported detector and nothing of PyTorch: ONNX Runtime (or OpenVINO) for the
model, NumPy for the rest.

    det = open_detector("exported/anomaly")          # patchcore.json's method picks the class and its file
    scores, maps, ok, reasons = det.predict(paths)   # (N,) and (N, h, w) float64; NaN where a file is unreadable
    det.threshold                                    # a score at or above it is a defect (None: no verdict)

export.py writes the folder beside model.onnx when the checkpoint holds a detector (vit/deploy/export.py:
`export_patchcore`, vit/deploy/anomaly_export.py: `export_dinomaly`), with patchcore.json, its settings and grid:

- PatchCore and AnomalyDINO (`OnnxPatchCore`): features.onnx, a separate model from images (B, C, S, S) to patch
  features (B, h*w, F) (the blocks' tokens, neighbourhood-averaged: `vit.eval.anomaly.PatchFeatures`); bank.npy,
  the coreset (K, F) float32, read with allow_pickle=False (a plain array, never a pickle). The score is
  vit.eval.anomaly's: s = max_p min_m ||f_p - m||_2 (AnomalyDINO: 1 - cos, the mean of the top 1%).
- Dinomaly (`OnnxDinomaly`): dinomaly.onnx, encoder, bottleneck and decoder as one graph from images to the map
  (B, h, w), 1 - cos(encoder, decoder) per patch; the image score is the mean of its `top_share` highest patches
  (vit.eval.dinomaly).

`detector_file` names each method's model file per runtime: features.xml / dinomaly.xml, the OpenVINO IR export.py
--format openvino writes (vit/deploy/openvino_ir.py), and features.int8.onnx / dinomaly.int8.onnx, the INT8 model
export.py --quantize int8 writes within an AUROC budget (vit/deploy/anomaly_int8.py), with --format openvino also
features.int8.xml / dinomaly.int8.xml by NNCF within the same budget. Images are read by the
preprocessing.json one folder up, as onnx_predict does. Imports numpy, Pillow, OpenCV and onnxruntime (or openvino)
only.
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

__all__ = ["OnnxDetector", "OnnxPatchCore", "OnnxDinomaly", "open_detector", "detector_file", "nearest_distance",
           "top_share_mean", "FEATURES_ONNX", "DINOMALY_ONNX", "BANK_NPY", "RUNTIMES"]

FEATURES_ONNX, DINOMALY_ONNX, BANK_NPY = "features.onnx", "dinomaly.onnx", "bank.npy"  # beside SETTINGS
RUNTIMES = ("onnx", "openvino", "int8", "openvino_int8")  # detector_file's: fp32 ONNX, OpenVINO IR, INT8 ONNX, INT8 IR


def detector_file(method: str, runtime: str = "onnx") -> str:
    """The model file of an exported detector of `method` for `runtime` (RUNTIMES): features.onnx, features.xml,
    features.int8.onnx, features.int8.xml for a nearest-neighbour bank; dinomaly.onnx, dinomaly.xml,
    dinomaly.int8.onnx, dinomaly.int8.xml for Dinomaly."""
    stem = Path(DINOMALY_ONNX if method == "dinomaly" else FEATURES_ONNX).stem
    return stem + {"onnx": ".onnx", "openvino": ".xml", "int8": ".int8.onnx", "openvino_int8": ".int8.xml"}[runtime]


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


def top_share_mean(patch: np.ndarray, share: float) -> np.ndarray:
    """(B, P) patch scores -> (B,) the mean of the ceil(share * P) highest (at least 1; share 0: the max), as
    vit.eval.anomaly.top_mean."""
    k = max(1, math.ceil(share * patch.shape[1] - 1e-9))
    return -np.sort(-patch, axis=1)[:, :k].mean(1)


class OnnxDetector:
    """What every exported detector shares: its files checked, the preprocessing.json one folder up, patchcore.json's
    settings and grid, the session of its model file (`features`), and `predict` over image files. A subclass says
    which files it needs (`NEEDS`), loads its own (`load`) and turns a batch into scores and maps (`score`)."""

    NEEDS: tuple[str, ...] = ()
    MODEL_FILE = FEATURES_ONNX  # `features` when none is named: the fp32 ONNX file

    def __init__(self, folder: str | Path, preprocessing: str | Path | None = None, threads: int = 0,
                 features: str | None = None) -> None:
        folder, features = Path(folder), features or self.MODEL_FILE
        redo = "export the checkpoint again with export.py" + (" --format openvino" * features.endswith(".xml"))
        needs = (features, *self.NEEDS, SETTINGS)
        for name in needs:
            regular_file(folder / name, f"{folder} needs {', '.join(needs[:-1])} and {SETTINGS}: {redo}")
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
        self.settings, self.method = settings, settings["method"]
        self.threshold, self.grid = settings["threshold"], tuple(settings["grid"])
        self.normalize, self.top_share = settings["normalize"], settings["top_share"]
        self.folder, self.features = folder, folder / features
        self.load(folder, redo)
        try:
            self.session = open_session(self.features, threads)
        except Exception as e:  # onnxruntime's own errors (not a model, truncated file); OpenVINO's are one already
            if self.features.suffix == ".xml":
                raise
            raise ValueError(f"ONNX Runtime cannot load {self.features}: {str(e).splitlines()[0]}") from None
        self.input = self.session.get_inputs()[0].name
        self.check_outputs(self.session.get_outputs()[0].shape, redo)

    def load(self, folder: Path, redo: str) -> None:
        """Read the files beside the model (a bank); nothing for a detector that is its model alone."""

    def check_outputs(self, dims: list, redo: str) -> None:
        """ValueError (one sentence ending in `redo`) when the model's declared output cannot be this detector's."""

    def score(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Preprocessed images (B, C, S, S) float32 -> (image scores (B,), patch score maps (B, h, w)) float64."""
        raise NotImplementedError

    def predict(self, paths: list[Path], batch_size: int = 32) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                         list[str]]:
        """-> scores (N,), maps (N, h, w), readable (N,) bool, and the reason for each unreadable file ('')."""
        n = len(paths)
        scores, maps = np.full(n, np.nan), np.full((n, *self.grid), np.nan)
        ok, reasons = np.zeros(n, dtype=bool), [""] * n
        for idx, x in load_batches(self.preprocess, paths, batch_size, reasons):
            (scores[idx], maps[idx]), ok[idx] = self.score(x), True
        return scores, maps, ok, reasons


class OnnxPatchCore(OnnxDetector):
    """PatchCore or AnomalyDINO: the feature model's patch features against bank.npy (see the module docstring)."""

    NEEDS = (BANK_NPY,)

    def load(self, folder: Path, redo: str) -> None:
        try:
            self.bank = np.load(folder / BANK_NPY, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise ValueError(f"{folder} does not hold an exported PatchCore ({str(e)[:120]}); {redo}.") from None
        if (self.bank.dtype != np.float32 or self.bank.ndim != 2 or not len(self.bank)
                or not np.isfinite(self.bank).all()):
            raise ValueError(f"{folder / BANK_NPY} is not a finite, non-empty (K, F) float32 bank; {redo}.")

    def check_outputs(self, dims: list, redo: str) -> None:
        for dim, want, what in ((1, math.prod(self.grid), "patches"), (2, self.bank.shape[1], "features")):
            if len(dims) != 3 or isinstance(dims[dim], int) and dims[dim] != want:  # symbolic where dynamic
                raise ValueError(f"{self.features} gives outputs {dims}, but the bank and grid need {want} "
                                 f"{what} in dimension {dim}; {redo}.")

    def score(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        feats = self.session.run(None, {self.input: x})[0]  # (B, h*w, F)
        if feats.ndim != 3 or feats.shape[2] != self.bank.shape[1] or feats.shape[1] != math.prod(self.grid):
            raise ValueError(f"{self.features} gives features {feats.shape}, but the bank holds "
                             f"{self.bank.shape[1]}-vectors on a {self.grid} grid; export the checkpoint again.")
        patch = nearest_distance(feats.reshape(-1, feats.shape[2]), self.bank).reshape(len(x), -1)
        patch = patch**2 / 2 if self.normalize else patch  # unit features (normalised in the ONNX): 1 - cos
        return top_share_mean(patch, self.top_share), patch.reshape(len(x), *self.grid)


class OnnxDinomaly(OnnxDetector):
    """Dinomaly: dinomaly.onnx gives the map (B, h, w) itself; the score is the mean of its top_share highest."""

    MODEL_FILE = DINOMALY_ONNX

    def check_outputs(self, dims: list, redo: str) -> None:
        if len(dims) != 3 or any(isinstance(d, int) and d != g for d, g in zip(dims[1:], self.grid)):
            raise ValueError(f"{self.features} gives outputs {dims}, but a Dinomaly map on the {self.grid} grid is "
                             f"(batch, {self.grid[0]}, {self.grid[1]}); {redo}.")

    def score(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        maps = self.session.run(None, {self.input: x})[0]  # (B, h, w)
        if maps.shape != (len(x), *self.grid):
            raise ValueError(f"{self.features} gives maps {maps.shape}, not ({len(x)}, {self.grid[0]}, "
                             f"{self.grid[1]}); export the checkpoint again.")
        maps = maps.astype(np.float64)
        return top_share_mean(maps.reshape(len(x), -1), self.top_share), maps


def open_detector(folder: str | Path, preprocessing: str | Path | None = None, threads: int = 0,
                  runtime: str = "onnx") -> OnnxDetector:
    """The exported detector in `folder` on `runtime` (RUNTIMES), of the class its patchcore.json's method names."""
    folder = Path(folder)
    redo = "export the checkpoint again with export.py"
    if not (folder / SETTINGS).is_file():
        raise FileNotFoundError(f"{folder} has no {SETTINGS}; {redo}.")
    method = read_settings(folder / SETTINGS, redo)["method"]
    cls = OnnxDinomaly if method == "dinomaly" else OnnxPatchCore
    return cls(folder, preprocessing, threads, features=detector_file(method, runtime))
