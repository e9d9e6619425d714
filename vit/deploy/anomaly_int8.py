"""INT8 of an exported detector's model (features.int8.onnx, dinomaly.int8.onnx) within a budget on the detector's
own validation images: what export.py --quantize int8 adds to an anomaly checkpoint's export.

    data = detector_images(fitted_settings, scorer.preprocess)        # the folders anomaly.py fit recorded
    res = quantize_detector(folder, data, ("dynamic", "static"), max_drop=0.5)

The budget is in points of one number measured with the exported scorer (vit/deploy/onnx_anomaly.py), fp32 file
against INT8 file, on the folders patchcore.json records from `anomaly.py fit`:
  image_auroc        with defective validation images (`val_defects`): the image AUROC of good (`val`) against
                     defective ones (vit.eval.anomaly_metrics.auroc), INT8 may lose at most `max_drop` points;
  verdict_agreement  without them: the share of good validation images whose verdict (score >= threshold) INT8
                     keeps from fp32, at least 100 - `max_drop` percent.
Static INT8 is calibrated on the good training images (`good`). Quantization is vit/deploy/quantize.py's, the
classifier's: the same methods (dynamic; static QDQ), the same candidates (MatMul/Gemm with a constant weight),
and the same fallback when the whole model loses too much (the most sensitive layer groups kept float, the fewest
that keep the budget, `fewest_float_groups`; sensitivity: how far each group alone moves the scores). Of the
methods that keep the budget the fastest at batch 1 against the fp32 file on ONNX Runtime is kept.

With --format openvino the detector's IR (features.xml, dinomaly.xml) is quantized too, by NNCF on the same
calibration images (`quantize_detector_openvino`, vit/deploy/openvino_int8.py's `nncf_quantize`), its number
measured on OpenVINO against the fp32 IR within the same budget: NNCF's one attempt, taken or refused.
"""

from __future__ import annotations

import glob
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data.base import image_files
from ..eval.anomaly_metrics import auroc
from ..utils.timing import interleaved, ratio_stats
from .onnx_anomaly import OnnxDetector, open_detector
from .onnx_predict import load_batches
from .quantize import QuantizeError, fewest_float_groups, prepare, quantize, signed_points, weight_groups, within_budget

__all__ = ["DetectorImages", "BUDGETS", "spec_paths", "detector_images", "budget_value", "quantize_detector",
           "quantize_detector_openvino", "describe_detector_change"]

BUDGETS = {"image_auroc": "image AUROC", "verdict_agreement": "verdict agreement with fp32"}


@dataclass
class DetectorImages:
    """Preprocessed float32 images (N, C, S, S): good validation images, defective ones (None: none recorded), the
    calibration images (good training images), and a phrase saying where they came from."""

    good: np.ndarray
    defects: np.ndarray | None
    calib: np.ndarray
    source: str

    @property
    def metric(self) -> str:
        return "verdict_agreement" if self.defects is None else "image_auroc"


def spec_paths(specs) -> list[Path]:
    """The image files of what anomaly.py fit was given (folders searched recursively, files, globs), in order."""
    paths: list[Path] = []
    for spec in [specs] if isinstance(specs, str) else specs or []:
        p = Path(spec).expanduser()
        found = sorted(image_files(p)) if p.is_dir() else [p] if p.is_file() else sorted(
            Path(g) for g in glob.glob(str(p), recursive=True) if Path(g).is_file())
        paths += found
    return paths


def _load(preprocess, specs, what: str, limit: int | None = None) -> np.ndarray:
    paths = spec_paths(specs)[:limit]
    reasons = [""] * len(paths)
    xs = [x for _, x in load_batches(preprocess, paths, 64, reasons)]
    if not xs:
        raise QuantizeError(f"patchcore.json records {what} {' '.join(map(str, specs or []))!r}, where no readable "
                            "image is now (relative paths are read from the folder export.py runs in); run export.py "
                            "from where anomaly.py fit ran, or fit again with absolute paths.")
    return np.concatenate(xs)


def detector_images(settings: dict, preprocess, calibration_images: int = 64) -> DetectorImages:
    """The images the detector's INT8 budget is measured and calibrated on, from the folders its `settings`
    (the checkpoint's patchcore.json) record, read by `preprocess` (the export's preprocessing)."""
    if not settings.get("val"):
        raise QuantizeError("the detector was fitted without --val, so there are no good validation images to keep "
                            "its INT8 budget on (nor a threshold); fit it again with --val, or export without "
                            "--quantize.")
    good = _load(preprocess, settings["val"], "--val")
    defects = _load(preprocess, settings["val_defects"], "--val-defects") if settings.get("val_defects") else None
    calib = _load(preprocess, settings.get("good") or settings["val"], "--good", calibration_images)
    source = f"{len(good)} good validation image(s)" + (f" and {len(defects)} defective" if defects is not None
                                                         else " (no defective images recorded)")
    return DetectorImages(good, defects, calib, source)


def _scores(det: OnnxDetector, x: np.ndarray, batch: int = 32) -> np.ndarray:
    return np.concatenate([det.score(x[i:i + batch])[0] for i in range(0, len(x), batch)])


def budget_value(det: OnnxDetector, data: DetectorImages, reference: np.ndarray | None = None,
                 threshold: float | None = None) -> float:
    """The budget's number (a fraction) for the scorer `det`: image AUROC of data.good against data.defects, or
    without defects the share of good images whose verdict at `threshold` equals `reference`'s (fp32's verdicts)."""
    good = _scores(det, data.good)
    if data.defects is not None:
        bad = _scores(det, data.defects)
        return auroc(np.r_[good, bad], np.r_[np.zeros(len(good), bool), np.ones(len(bad), bool)])
    return float(((good >= threshold) == reference).mean())


def describe_detector_change(res: dict) -> str:
    """'image AUROC 98.00% -> 97.50% (-0.50 pt; budget: lose at most 0.5 pt; 10 good validation image(s) and 10
    defective)'."""
    m = res["metric"]
    return (f"{BUDGETS[m]} {100 * res[f'{m}_fp32']:.2f}% -> {100 * res[f'{m}_int8']:.2f}% "
            f"({signed_points(-res['drop_points'])}; budget: lose at most {res['max_drop']:g} pt; "
            f"{res['evaluated_on']})")


def _attempts(folder: Path, src: Path, method: str, data: DetectorImages, measure, plain: Path,
              groups: dict[str, list[str]], max_drop: float, log) -> dict:
    """One method: everything quantized, else the fewest most sensitive groups kept float that keep the budget.
    -> {"file", "value", "drop_points", "float_groups"}; QuantizeError when no allowed fallback keeps it."""
    dst, cache = folder / f"{method}-{src.stem}.int8.onnx", folder / f".{method}-calibration.json"
    tried: dict[tuple, dict] = {}

    def attempt(float_groups: list[str]) -> dict:
        quantize(plain, dst, method, [n for g in float_groups for n in groups[g]], data.calib, cache, prepared=True)
        value, drop = measure(dst.name)
        log(f"  anomaly {method:<8} {len(float_groups):>2} of {len(groups)} layer group(s) float: "
            f"{signed_points(-drop)}")
        tried[tuple(float_groups)] = dict(file=dst, value=value, drop_points=drop, float_groups=list(float_groups))
        return tried[tuple(float_groups)]

    try:
        if within_budget(attempt([])["drop_points"], max_drop):
            return tried[()]
        fp32 = _scores(open_detector_file(folder, src.name), data.calib)
        moved = {}
        for g, nodes in groups.items():  # each group alone: how far it moves the calibration images' scores
            quantize(plain, dst, method, calib=data.calib, cache=cache, only=nodes, prepared=True)
            moved[g] = float(np.abs(_scores(open_detector_file(folder, dst.name), data.calib) - fp32).mean())
        ranking = sorted(moved, key=moved.get, reverse=True)
        best, drops = fewest_float_groups(ranking, lambda fl: attempt(fl)["drop_points"], max_drop)
        if best is None:
            k = max(drops)
            raise QuantizeError(f"{method} INT8 of the anomaly model loses {drops[k]:.2f} points with the {k} most "
                                f"sensitive of {len(groups)} layer groups kept float, over the budget of {max_drop:g}.")
        if best != list(drops)[-1]:  # the file on disk is the last attempt: write the chosen one again
            attempt(ranking[:best])
        return tried[tuple(ranking[:best])]
    finally:
        cache.unlink(missing_ok=True)


def open_detector_file(folder: Path, name: str, threads: int = 0) -> OnnxDetector:
    """The detector in `folder` scored with its model file `name` (an INT8 attempt beside the fp32 file)."""
    det = open_detector(folder)
    return type(det)(folder, None, threads, features=name) if det.features.name != name else det


def _speed(folder: Path, src: str, files: list[str], x: np.ndarray, threads: int, repeats: int = 7) -> dict:
    """Per INT8 file, how many times faster than the fp32 file it scores batch `x` on ONNX Runtime at `threads`:
    interleaved repeats after warm-up, median with min-max (vit.utils.timing)."""
    dets = {name: open_detector_file(folder, name, threads) for name in [src, *files]}
    calls = {name: (lambda d=d: d.score(x)) for name, d in dets.items()}
    for fn in calls.values():
        fn()
    t = interleaved(calls, 1, repeats, max(1, int(0.1 / max(_once(calls[src]), 1e-6))))
    return {f: dict(int8_over_ort_fp32=ratio_stats(t.wall[f], t.wall[src]), threads=threads, batch=len(x),
                    repeats=repeats, images_per_s={"ort_fp32": len(x) / statistics.median(t.wall[src]),
                                                   "int8": len(x) / statistics.median(t.wall[f])}) for f in files}


def _once(fn) -> float:
    import time

    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def quantize_detector(folder: str | Path, data: DetectorImages, methods: tuple[str, ...] = ("dynamic", "static"),
                      max_drop: float = 0.5, threads: int = 1, log=print) -> dict:
    """The INT8 model of the exported detector in `folder` (features.int8.onnx or dinomaly.int8.onnx beside the
    fp32 file) within `max_drop` points of `data.metric`, by the fastest of `methods` that keeps it; returns the
    numbers verification.json records. QuantizeError when none keeps it, the last attempt left at <file>.rejected."""
    folder = Path(folder)
    det = open_detector(folder)
    src, dst = det.features, folder / (det.features.stem + ".int8.onnx")
    if data.defects is None and det.threshold is None:
        raise QuantizeError("the detector has no threshold, so its verdicts cannot be kept; fit it with --val.")
    reference = None if data.defects is not None else _scores(det, data.good) >= det.threshold
    fp32 = budget_value(det, data, reference, det.threshold)
    log(f"anomaly INT8 ({', '.join(methods)}): {BUDGETS[data.metric]} on {data.source}, budget: lose at most "
        f"{max_drop:g} pt" + ("; no defective validation images recorded, so the budget is on the good images' "
                              "verdicts" if data.defects is None else ""))

    def measure(name: str) -> tuple[float, float]:
        value = budget_value(open_detector_file(folder, name), data, reference, det.threshold)
        return value, 100 * (fp32 - value)

    plain = prepare(src, folder / f".plain-{src.name}")
    candidates, failures = {}, []
    try:
        groups = weight_groups(plain, scopes_from=src)
        if not groups:
            raise QuantizeError(f"{src.name} has no linear layer to quantize.")
        for method in methods:
            try:
                candidates[method] = _attempts(folder, src, method, data, measure, plain, groups, max_drop, log)
            except QuantizeError as e:
                failures.append(str(e))
    finally:
        plain.unlink(missing_ok=True)
    if not candidates:
        for method in methods:  # the last attempt, for inspection, never under the loadable name
            tried = folder / f"{method}-{dst.name}"
            if tried.is_file():
                tried.replace(folder / f"{dst.name}.rejected")
        raise QuantizeError(" ".join(failures))
    speeds = _speed(folder, src.name, [c["file"].name for c in candidates.values()], data.good[:1], threads)
    best = max(candidates, key=lambda m: speeds[candidates[m]["file"].name]["int8_over_ort_fp32"]["median"])
    chosen = candidates[best]
    chosen["file"].replace(dst)
    for c in candidates.values():
        c["file"].unlink(missing_ok=True)
    m = data.metric
    res = dict(metric=m, **{f"{m}_fp32": fp32, f"{m}_int8": chosen["value"]}, drop_points=chosen["drop_points"],
               max_drop=max_drop, method=best, float_groups=chosen["float_groups"], layer_groups=len(groups),
               images_good=len(data.good), images_defects=0 if data.defects is None else len(data.defects),
               evaluated_on=data.source, calibration_images=len(data.calib), rejected=failures,
               speed=speeds[chosen["file"].name], bytes_fp32=src.stat().st_size, bytes_int8=dst.stat().st_size,
               file=str(dst))
    res["size_ratio"] = res["bytes_fp32"] / res["bytes_int8"]
    return res


def quantize_detector_openvino(folder: str | Path, data: DetectorImages, max_drop: float = 0.5, threads: int = 1,
                               log=print) -> dict:
    """The NNCF INT8 IR of the exported detector in `folder` (features.int8.xml or dinomaly.int8.xml, with its .bin,
    beside the fp32 IR), calibrated on `data.calib`, kept only within `max_drop` points of `data.metric` against the
    fp32 IR; -> quantize_detector's keys (method "nncf", no layer group kept float, speed against the fp32 ONNX
    file). Over the budget: QuantizeError, one sentence, the attempt moved to <file>.rejected (and its .bin)."""
    from .onnx_anomaly import detector_file
    from .openvino_int8 import nncf_quantize
    from .openvino_ir import ir_bytes, weights_of

    folder = Path(folder)
    det = open_detector(folder, runtime="openvino")
    src, dst = det.features, folder / detector_file(det.method, "openvino_int8")
    if data.defects is None and det.threshold is None:
        raise QuantizeError("the detector has no threshold, so its verdicts cannot be kept; fit it with --val.")
    reference = None if data.defects is not None else _scores(det, data.good) >= det.threshold
    fp32 = budget_value(det, data, reference, det.threshold)
    log(f"anomaly OpenVINO INT8 (NNCF): {BUDGETS[data.metric]} on {data.source}, budget: lose at most "
        f"{max_drop:g} pt")
    nncf_quantize(src, dst, data.calib)
    value = budget_value(open_detector(folder, runtime="openvino_int8"), data, reference, det.threshold)
    m, drop = data.metric, 100 * (fp32 - value)
    if not within_budget(drop, max_drop):
        for f in (weights_of(dst), dst):
            f.replace(f.with_name(f"{f.name}.rejected"))
        raise QuantizeError(f"NNCF INT8 of the anomaly model loses {drop:.2f} {BUDGETS[m]} points on {data.source} "
                            f"({100 * fp32:.2f}% -> {100 * value:.2f}%), over the budget of {max_drop:g}.")
    onnx = detector_file(det.method, "onnx")
    speeds = _speed(folder, onnx, [src.name, dst.name], data.good[:1], threads) if (folder / onnx).is_file() else {}
    res = dict(metric=m, **{f"{m}_fp32": fp32, f"{m}_int8": value}, drop_points=drop, max_drop=max_drop,
               method="nncf", float_groups=[], layer_groups=None, images_good=len(data.good),
               images_defects=0 if data.defects is None else len(data.defects), evaluated_on=data.source,
               calibration_images=len(data.calib), rejected=[], bytes_fp32=ir_bytes(src), bytes_int8=ir_bytes(dst),
               file=str(dst))
    if speeds:  # the INT8 IR against the fp32 ONNX file, as the ONNX INT8 entry; OpenVINO fp32 beside it
        res["speed"] = dict(speeds[dst.name], ov_fp32_over_ort_fp32=speeds[src.name]["int8_over_ort_fp32"])
    res["size_ratio"] = res["bytes_fp32"] / res["bytes_int8"]
    return res
