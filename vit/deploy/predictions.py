"""Prediction rows: the top-k classes and probabilities of each input, as predict.py writes them, and the ONNX
Runtime predictor that makes them without torch.

    rows = rows_for(paths, probs, classes, topk=5)                 # path, pred1, pred1_name, prob1, ...
    write_rows(Path("preds"), "csv", rows)                           # predictions.csv (or .json / .jsonl)
    result = predict_onnx_images("exported/model.onnx", paths)       # rows, skipped, seconds

Torch-free (numpy, and ONNX Runtime for `predict_onnx_images`): predict.py --onnx runs where only numpy,
Pillow, OpenCV and onnxruntime are installed. The torch predictor is vit/deploy/predict.py.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ANOMALY_KEYS", "Predictions", "rows_for", "add_anomaly", "write_rows", "check_threshold",
           "detector_runtime", "predict_onnx_images"]

ANOMALY_KEYS = ("anomaly_score", "verdict", "cam", "anomaly_map")  # what a row may add after the top-k


@dataclass
class Predictions:
    """What a predictor returns: one row per readable input in input order (`rows_for`'s), every input passed
    over with its reason, and how long the model took. `good`, `dataset`, `threshold` and `anomaly_maps` let a
    caller draw overlays of the readable inputs afterwards (vit/explain/overlays.py)."""

    rows: list[dict]
    skipped: list[tuple[str, str]]
    seconds: float
    threshold: float | None = None  # multi-label: the probability from which a class is predicted
    good: list[int] = field(default_factory=list)  # the readable inputs' indices, in the order of `rows`
    dataset: object = None  # vit.eval.inference.ImageFiles (torch predictor only)
    anomaly_maps: object = None  # the detector's (N, h, w) patch scores of every input, when the model has one
    detector: object = None  # the torch-free predictor's detector (vit.deploy.onnx_anomaly), for its threshold
    num_processes: int = 1


def rows_for(paths, probs, classes: list[str], topk: int, threshold: float | None = None) -> list[dict]:
    """One row per image: path, then pred1, pred1_name, prob1, ... as evaluate.py's predictions.csv.
    `probs`: (N, C) probabilities, a numpy array (both predictors, torch and ONNX, give one): softmax, or for a
    multi-label model (`threshold` given) sigmoids, with first `labels`, the classes at or above the threshold."""
    import numpy as np

    probs = np.asarray(probs, dtype=np.float32)
    order = np.argsort(-probs, axis=1, kind="stable")[:, :min(topk, len(classes))]  # ties: the lower index first
    rows = []
    for path, p, idx in zip(paths, probs, order):
        row: dict = {"path": str(path)}
        if threshold is not None:  # multi-label: the classes at or above the threshold come first
            row["labels"] = " ".join(classes[i] for i in np.flatnonzero(p >= threshold).tolist())
        for r, i in enumerate(idx.tolist(), 1):
            row.update({f"pred{r}": i, f"pred{r}_name": classes[i], f"prob{r}": float(p[i])})
        rows.append(row)
    return rows


def add_anomaly(rows: list[dict], scores, threshold: float | None) -> None:
    """Each row gets anomaly_score (PatchCore's: the worst patch's distance to the bank of good patches) and
    verdict: defect at or above `threshold` (chosen on good validation images and saved with the bank), good
    below, empty when the bank has no threshold."""
    for row, s in zip(rows, scores):
        row["anomaly_score"] = float(s)
        row["verdict"] = "" if threshold is None else "defect" if s >= threshold else "good"


def write_rows(out: Path, fmt: str, rows: list[dict]) -> Path:
    """`rows` written atomically as `out`/predictions.<fmt> (csv: flat, probabilities with 6 decimals; json /
    jsonl: one object per row with its top-k nested); returns the path."""
    from vit.utils.atomic import atomic_write_csv, atomic_write_text

    path = Path(out) / f"predictions.{fmt}"
    if fmt == "csv":  # probabilities with 6 decimals, as evaluate.py writes them
        text_rows = [{k: f"{v:.6f}" if k.startswith("prob") or k == "anomaly_score" else v for k, v in r.items()}
                     for r in rows]
        atomic_write_csv(path, list(rows[0]), text_rows)
        return path
    nested = []
    for r in rows:
        k = sum(key.startswith("prob") for key in r)
        item = {"path": r["path"], **({"labels": r["labels"].split()} if "labels" in r else {}),
                "topk": [{"index": r[f"pred{j}"], "class": r[f"pred{j}_name"], "prob": r[f"prob{j}"]}
                         for j in range(1, k + 1)]}
        nested.append({**item, **{k: r[k] for k in ANOMALY_KEYS if k in r}})
    text = json.dumps(nested, indent=1) if fmt == "json" else "".join(json.dumps(n) + "\n" for n in nested)
    atomic_write_text(path, text)
    return path


def check_threshold(threshold: float | None, multi_label: bool) -> None:
    """--threshold: a probability, and only for a multi-label model (ValueError, one sentence)."""
    if threshold is not None and not 0 < threshold < 1:
        raise ValueError(f"--threshold must be between 0 and 1 (a probability), got {threshold}.")
    if threshold is not None and not multi_label:
        raise ValueError("--threshold is for multi-label models (trained with data.labels_file); this model picks "
                         "one class per image: use --topk.")


def detector_runtime(onnx: str | Path) -> tuple[Path, str]:
    """(the anomaly/ folder beside an export.py model file, the runtime its detector runs on, as
    vit.deploy.onnx_anomaly.detector_file names them): a model.int8.xml's detector on its NNCF INT8 IR
    (features.int8.xml), a model.xml's on OpenVINO (features.xml), a model.int8.onnx's on its INT8 file
    (features.int8.onnx), else fp32 ONNX; an INT8 model whose export has no INT8 detector file gets the fp32 one."""
    onnx = Path(onnx)
    folder = onnx.parent / "anomaly"
    fp32, int8 = ("openvino", "openvino_int8") if onnx.suffix == ".xml" else ("onnx", "int8")
    if onnx.name.endswith(".int8" + onnx.suffix) and _detector_has(folder, int8):
        return folder, int8
    return folder, fp32


def _detector_has(folder: Path, runtime: str) -> bool:
    """Whether `folder` holds an exported detector with its model file for `runtime` (detector_file's)."""
    from .onnx_anomaly import SETTINGS, detector_file

    if not (folder / SETTINGS).is_file():
        return False
    from ..eval.anomaly_settings import read_settings

    method = read_settings(folder / SETTINGS, "export the checkpoint again with export.py")["method"]
    return (folder / detector_file(method, runtime)).is_file()


def predict_onnx_images(onnx: str | Path, paths: list[Path], batch_size: int = 32, topk: int = 5,
                        threshold: float | None = None, clf=None) -> Predictions:
    """Rows for `paths` from an export.py model.onnx with ONNX Runtime and its preprocessing.json (a multi-label
    export: its sigmoids and the labels at `threshold`, else its own); an anomaly/ folder beside the model adds
    each row's anomaly score and verdict (any method: vit.deploy.onnx_anomaly.open_detector), and the result its
    maps and detector (`anomaly_maps`, `detector`). `clf`: the OnnxClassifier of `onnx`, when the caller opened it. A
    model.xml (export.py --format openvino) runs both on OpenVINO instead, a model.int8.onnx or model.int8.xml both
    in INT8 (`detector_runtime`)."""
    import numpy as np

    from .onnx_anomaly import open_detector
    from .onnx_predict import OnnxClassifier

    clf = clf or OnnxClassifier(onnx)
    folder, runtime = detector_runtime(onnx)  # export.py's copy of an anomaly checkpoint's detector, if any
    detector = open_detector(folder, runtime=runtime) if folder.is_dir() else None
    check_threshold(threshold, clf.threshold is not None)
    threshold = threshold if threshold is not None else clf.threshold  # None: single-label (softmax)
    t0 = time.perf_counter()
    probs, ok, reasons = clf.predict(paths, batch_size)
    seconds = time.perf_counter() - t0
    skipped = [(str(p), r) for p, r, good in zip(paths, reasons, ok) if not good]
    readable = [p for p, good in zip(paths, ok) if good]
    good = [i for i, flag in enumerate(ok) if flag]
    rows = rows_for(readable, probs[ok], clf.classes, topk, threshold) if readable else []
    result = Predictions(rows, skipped, seconds, threshold, good)
    if detector is not None and readable:
        scores, maps, _, _ = detector.predict(readable, batch_size)
        add_anomaly(rows, scores, detector.threshold)
        result.anomaly_maps = np.full((len(paths), *detector.grid), np.nan)  # indexed as the inputs, as torch's
        result.anomaly_maps[good] = maps
        result.detector = detector
    return result
