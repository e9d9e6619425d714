"""An export folder: each format written and checked against the eager model, then moved in with its sidecars
(preprocessing.json, verification.json), all or nothing; what export.py writes. OpenVINO IR (model.xml + model.bin)
is the verified model.onnx converted, and with INT8 asked also model.int8.xml by NNCF (vit/deploy/openvino_int8.py).

    model, cfg, classes, _ = load_model_and_config(checkpoint="runs/default/best")   # vit/eval/inference.py
    report = export_folder(model, cfg, classes, Path("exported"), ["onnx"], checkpoint="runs/default/best")

Every file is written and checked in a staging folder inside `out`; only when all pass do they take their names
and the sidecars follow, so a failed or interrupted export leaves the folder as it was.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..config import ConfigError
from ..data import DataError, build_datasets
from ..data.synthetic import photo_like
from ..data.transforms import build_transform
from ..eval.anomaly_settings import ANOMALY_DIR, SETTINGS_FILE, check_whole_images, detector_folder
from ..eval.inference import ImageFiles
from ..eval.multilabel import decision_threshold
from ..utils.atomic import atomic_write_text
from .export import (
    FORMATS,
    ExportableClassifier,
    fingerprint,
    preprocessing,
    write_preprocessing,
)
from .int8 import INT8_FILE, budget_metric, labelled_images, samples
from .openvino_ir import OPENVINO_INT8_FILE, convert_onnx, weights_of

__all__ = ["Int8Request", "export_folder", "verification_images", "exported_detector", "detector_int8"]


@dataclass(frozen=True)
class Int8Request:
    """export.py --quantize int8's options (vit/deploy/int8.py): `method` auto | dynamic | static, the points of
    `metric` (None: the model's own, top1 or mAP) INT8 may lose, the labelled `eval_images` folder (None: the
    checkpoint's validation split), the training images that calibrate static INT8, and the speed check's threads."""

    method: str = "auto"
    max_drop: float = 0.5
    metric: str | None = None
    eval_images: str | None = None
    calibration_images: int = 64
    threads: int = 1


def verification_images(cfg, classes, size: int, paths: list[Path] | None = None, checkpoint=None,
                        n: int = 5) -> tuple[torch.Tensor, str]:
    """(n, C, size, size) evaluation images through the model's own preprocessing, and where they came from:
    the readable ones of `paths`, else the `checkpoint`'s validation split, else generated photo-like ones."""
    transform = build_transform(cfg.aug, size, train=False)
    if paths is not None:
        ds = ImageFiles(paths, transform, cfg.model.in_chans)
        xs = [x for x, ok, _ in (ds[i] for i in range(len(ds))) if ok][:n]
        if not xs:
            raise DataError(f"none of the {len(paths)} file(s) given is a readable image; pass images to verify on.")
        return torch.stack(xs), f"{len(xs)} image(s) from {' '.join(map(str, paths))}"
    if checkpoint:
        _, val, _ = build_datasets(cfg, check_images=False, splits=("val",), classes=classes)
        val.transform = transform  # the same split at `size`: evaluation preprocessing has no randomness
        xs = [x for x, _ in samples(val, n)]
        return torch.stack(xs), f"{len(xs)} image(s) of the checkpoint's {cfg.data.dataset} validation split"
    rng = np.random.default_rng(0)  # a model by name and no images: photo-like generated ones
    xs = [transform(photo_like(rng, 320, 240)) for _ in range(n)]
    return torch.stack(xs), f"{n} generated photo-like image(s) (pass --images for real ones)"


def previous_results(out: Path, model_id: str, exported: list[str], log: Callable[[str], None]) -> dict:
    """Entries of an earlier verification.json that still hold: formats not exported now whose file is there
    and was verified for this same model. A file left by another model is renamed <name>.stale, since the new
    preprocessing.json would no longer describe it."""
    try:
        old = json.loads((out / "verification.json").read_text())
    except (OSError, ValueError):
        old = {}
    kept = {}
    for fmt, name in {**FORMATS, "int8": INT8_FILE, "openvino_int8": OPENVINO_INT8_FILE}.items():
        if fmt in exported or not (out / name).is_file():
            continue
        entry = old.get("results", {}).get(fmt) if isinstance(old, dict) else None
        if isinstance(entry, dict) and entry.get("model_fingerprint") == model_id:
            kept[fmt] = entry
        else:
            for f in _files(out / name):
                f.replace(f.with_name(f"{f.name}.stale"))
            log(f"{out / name} was made from another model: renamed {name}.stale")
    return kept


def export_verified(fmt: str, model, wrapper, x, batches, staging: Path, out: Path, model_id: str,
                    log: Callable[[str], None]) -> tuple[Path, dict]:
    """One format exported into `staging` and checked against the eager model on `batches`: (its staged path, its
    verification.json entry), and one line; a file that fails the check is kept in `out` as <name>.rejected."""
    from .export import ExportError, export_model, load_exported, verify

    t0 = time.perf_counter()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):  # the exporters' chatter
        warnings.simplefilter("ignore")
        onnx = staging / FORMATS["onnx"]
        if fmt == "openvino" and onnx.is_file():  # the ONNX file just verified, converted
            path = convert_onnx(onnx, staging / FORMATS["openvino"])
        else:
            path = export_model(wrapper, fmt, staging, x)
    seconds = time.perf_counter() - t0
    try:
        check = verify(model, load_exported(path, fmt), batches)
    except ExportError as e:
        rejected = out / f"{path.name}.rejected"
        for f in _files(path):
            f.replace(out / f"{f.name}.rejected")
        raise ExportError(f"{e} Nothing in {out} was replaced; the file is kept as {rejected}.") from None
    log(f"{fmt:<17} {out / path.name}  ({seconds:.1f} s)  max |p - p_torch| = {check['max_abs_prob_diff']:.1e} "
        f"(<= {check['atol']:g}), same top-1 on all {check['images']} rows: ok")
    return path, dict(file=str(out / path.name), export_seconds=seconds, model_fingerprint=model_id, **check)


def quantized(req: Int8Request, model, data, metric: str, fp32: Path, staging: Path, out: Path, checkpoint,
              log: Callable[[str], None]) -> dict:
    """model.int8.onnx in `staging` (vit/deploy/int8.py) and one line of its numbers; QuantizeError (exit 2) when
    no INT8 model keeps the budget, the best attempt kept as model.int8.onnx.rejected in `out`."""
    from ..eval.multilabel import saved_threshold
    from .int8 import describe_change, quantize_int8
    from .quantize import QuantizeError

    methods = ("dynamic", "static") if req.method == "auto" else (req.method,)
    threshold = saved_threshold(checkpoint) or 0.5  # micro_f1: the threshold training chose
    try:
        res = quantize_int8(fp32, staging / INT8_FILE, model, data, methods, metric, req.max_drop, threshold,
                            req.threads, log=log)
    except QuantizeError as e:
        keep_rejected([staging / INT8_FILE], out)
        raise QuantizeError(f"{e} Nothing in {out} was replaced (the last attempt is {out / INT8_FILE}.rejected); "
                            "raise --max-drop or keep the fp32 model.onnx.") from None
    res["file"] = str(out / INT8_FILE)
    sp = res["speed"]
    log(f"int8 ({res['method']})       "
        + describe_change(metric, res[f"{metric}_fp32"], res[f"{metric}_int8"], req.max_drop, res["images"])
        + f", agrees with PyTorch on {100 * res['agreement_with_torch']:.1f}% of the images, "
        f"{len(res['float_groups'])} layer group(s) kept float; {res['bytes_fp32'] / 2**20:.1f} -> "
        f"{res['bytes_int8'] / 2**20:.1f} MiB ({res['size_ratio']:.1f}x smaller); batch 1, {req.threads} "
        f"thread(s): {sp['int8_over_eager_fp32']['median']:.2f}x PyTorch eager, "
        f"{sp['int8_over_ort_fp32']['median']:.2f}x ONNX Runtime fp32"
        + (f" (CPU time: {sp['cpu_int8_over_eager_fp32']['median']:.2f}x, "
           f"{sp['cpu_int8_over_ort_fp32']['median']:.2f}x)" if "cpu_int8_over_eager_fp32" in sp else ""))
    return res


def quantized_openvino(req: Int8Request, model, data, metric: str, staged: dict, staging: Path, out: Path,
                       checkpoint, log: Callable[[str], None]) -> dict:
    """model.int8.xml in `staging` by NNCF within the same budget (vit/deploy/openvino_int8.py), timed beside ONNX
    Runtime's fp32 and INT8 files, and one line of its numbers; QuantizeError (exit 2) over the budget, the attempt
    kept as model.int8.xml.rejected (and .bin) in `out`."""
    from ..eval.multilabel import saved_threshold
    from .int8 import describe_change
    from .openvino_int8 import quantize_openvino
    from .quantize import QuantizeError

    dst = staging / OPENVINO_INT8_FILE
    ort = {"fp32": staged["onnx"], **({"int8": staged["int8"]} if "int8" in staged else {})}
    try:
        res = quantize_openvino(staged["openvino"], dst, model, data, metric, req.max_drop,
                                saved_threshold(checkpoint) or 0.5, req.threads, ort, log)
    except QuantizeError as e:
        keep_rejected(_files(dst), out)
        raise QuantizeError(f"{e} Nothing in {out} was replaced (the attempt is {out / OPENVINO_INT8_FILE}.rejected);"
                            " raise --max-drop or keep the fp32 model.xml.") from None
    res["file"] = str(out / OPENVINO_INT8_FILE)
    sp = res["speed"]
    log("openvino int8     "
        + describe_change(metric, res[f"{metric}_fp32"], res[f"{metric}_int8"], req.max_drop, res["images"])
        + f", agrees with PyTorch on {100 * res['agreement_with_torch']:.1f}% of the images; "
        f"{res['bytes_fp32'] / 2**20:.1f} -> {res['bytes_int8'] / 2**20:.1f} MiB; batch 1, {req.threads} thread(s): "
        f"{sp['ov_int8_over_ort_fp32']['median']:.2f}x ONNX Runtime fp32"
        + (f", {sp['ov_int8_over_ort_int8']['median']:.2f}x ONNX Runtime INT8" if "ov_int8_over_ort_int8" in sp
           else "") + f" (OpenVINO fp32: {sp['ov_fp32_over_ort_fp32']['median']:.2f}x ONNX Runtime fp32)")
    return res


def exported_detector(model, folder: Path, staging: Path, batches, preprocessing_json: Path, openvino: bool,
                      int8: Int8Request | None, out: Path, log: Callable[[str], None]) -> dict:
    """The checkpoint's detector in `folder` (any method) exported into `staging`/anomaly/ and checked
    (vit/deploy/anomaly_export.py), with `int8` also its INT8 model within the budget (vit/deploy/anomaly_int8.py),
    and with `openvino` too its NNCF INT8 IR within the same budget: their verification.json entries (anomaly,
    anomaly_openvino, anomaly_int8, anomaly_openvino_int8), one line each. QuantizeError (exit 2) over the budget,
    the last attempt kept in `out` as anomaly-<file>.rejected and nothing else there replaced."""
    from ..eval.anomaly_settings import read_settings
    from ..eval.dinomaly import load_detector
    from .anomaly_export import export_detector
    from .anomaly_int8 import detector_images
    from .onnx_anomaly import open_detector

    det = load_detector(folder)  # a detector of tiles was refused before the exports (export_folder)
    results = {}
    for runtime, check in export_detector(model, det, staging / ANOMALY_DIR, batches, preprocessing_json,
                                          openvino).items():  # verification.json: anomaly, anomaly_openvino
        check["file"] = str(out / ANOMALY_DIR / Path(check["file"]).name)  # where it will be, not the staging copy
        results["anomaly" + ("" if runtime == "onnx" else f"_{runtime}")] = check
        log(f"anomaly {runtime:<9} {check['file']}  max |score - score_torch| = {check['max_abs_score_diff']:.1e}, "
            f"map {check['max_abs_map_diff']:.1e} (<= {check['atol']:g}): ok")
    if int8 is None:
        return results
    where = staging / ANOMALY_DIR
    data = detector_images(read_settings(folder / SETTINGS_FILE, "fit it again with anomaly.py fit"),
                           open_detector(where).preprocess, int8.calibration_images)
    results["anomaly_int8"] = detector_int8(where, data, int8, out, False, log)
    if openvino:
        results["anomaly_openvino_int8"] = detector_int8(where, data, int8, out, True, log)
    return results


def detector_int8(where: Path, data, int8: Int8Request, out: Path, openvino: bool, log: Callable[[str], None]) -> dict:
    """The staged detector's INT8 file in `where` (anomaly/ in staging): ONNX Runtime's (quantize_detector) or with
    `openvino` NNCF's IR (quantize_detector_openvino), its record with the file's final path in `out`, and one line.
    Over the budget: QuantizeError saying nothing in `out` was replaced, the attempt moved there as
    anomaly-<file>.rejected."""
    from .anomaly_int8 import describe_detector_change, quantize_detector, quantize_detector_openvino
    from .quantize import QuantizeError

    methods = ("dynamic", "static") if int8.method == "auto" else (int8.method,)
    try:
        res = (quantize_detector_openvino(where, data, int8.max_drop, int8.threads, log) if openvino else
               quantize_detector(where, data, methods, int8.max_drop, int8.threads, log))
    except QuantizeError as e:
        for f in where.glob("*.rejected"):
            f.replace(out / f"{ANOMALY_DIR}-{f.name}")
        raise QuantizeError(f"{e} Nothing in {out} was replaced (the last attempt is kept as {out}/{ANOMALY_DIR}-"
                            "<file>.rejected); raise --max-drop or export without --quantize.") from None
    res["file"] = str(out / ANOMALY_DIR / Path(res["file"]).name)
    speed = res.get("speed")
    log(f"anomaly {'openvino int8' if openvino else 'int8'} ({res['method']}) " + describe_detector_change(res)
        + f", {len(res['float_groups'])} layer group(s) kept float; {res['bytes_fp32'] / 2**20:.1f} -> "
        f"{res['bytes_int8'] / 2**20:.1f} MiB" + (f"; batch 1, {int8.threads} thread(s): "
                                                   f"{speed['int8_over_ort_fp32']['median']:.2f}x ONNX Runtime fp32"
                                                   if speed else ""))
    return res


def keep_rejected(files: list[Path], out: Path) -> None:
    """An INT8 attempt over its budget left beside each of `files` as <name>.rejected, moved into `out` (the export's
    folder, where the user looks; nothing else there is replaced)."""
    for f in files:
        rejected = f.with_name(f"{f.name}.rejected")
        if rejected.is_file():
            rejected.replace(out / rejected.name)


def _files(path: Path) -> list[Path]:
    """A model's files: an IR's .bin, then its .xml (the order they are moved in); any other file alone."""
    return [weights_of(path), path] if path.suffix == ".xml" else [path]


def _check_model(model, cfg, token_reduction: str | None) -> None:
    """A model export.py can write: square images (not data.naflex), token reduction at a fixed size only."""
    if cfg.data.naflex is not None:  # its images are patch batches of any length, which preprocessing.json and
        # predict.py --onnx's reference preprocessing (a resize and a square crop) cannot state
        raise ConfigError("export.py writes models that read square images, and this checkpoint reads each image at "
                          "its own aspect ratio (data.naflex); run it with predict.py --checkpoint, or export it from "
                          "Python with vit.deploy.export.ExportableNaFlexClassifier (docs/naflex.md).")
    if token_reduction:
        if model.dynamic_img_size:  # the merge count r depends on the token count, fixed only at a fixed size
            raise ConfigError("--token-reduction needs a fixed input size; drop --dynamic-img-size.")
        model.set_token_reduction(token_reduction)


def export_folder(model, cfg, classes: list[str], out: Path, formats: list[str], *, paths: list[Path] | None = None,
                  checkpoint: str | Path | None = None, token_reduction: str | None = None,
                  int8: Int8Request | None = None, detector: str | None = None,
                  log: Callable[[str], None] = print) -> dict:
    """`model` exported to `out` in each of `formats` (vit.deploy.export.FORMATS' keys; "onnx" first when `int8`
    asks for model.int8.onnx too), each checked on verification_images' batches, then moved in with
    preprocessing.json and verification.json, whose dict is returned; an anomaly `checkpoint` adds its feature
    model and bank (anomaly/; `detector`: which of its named detectors, anomaly/<detector>/). `log` gets one line
    per file."""
    _check_model(model, cfg, token_reduction)
    anomaly = detector_folder(checkpoint, detector) if "onnx" in formats else None  # a bad name before slow work
    if anomaly is not None and (anomaly / SETTINGS_FILE).is_file():
        check_whole_images(anomaly)  # a detector of tiles, too
    size = cfg.model.img_size
    if int8 is not None:  # every input checked before the exports' slow work
        metric = budget_metric(cfg, int8.metric)
        data = labelled_images(cfg, classes, int8.eval_images, int8.calibration_images)
    x, source = verification_images(cfg, classes, size, paths, checkpoint)
    batches = [x[:1], x]
    if model.dynamic_img_size:  # the same images at a second size, two tokens larger
        x2, _ = verification_images(cfg, classes, size + 2 * model.patch_embed.token_step[0], paths, checkpoint)
        batches += [x2[:1], x2]
    wrapper, model_id = ExportableClassifier(model), fingerprint(model)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    log(f"verifying on {source}, batches {', '.join('x'.join(map(str, b.shape)) for b in batches)}")
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out))
    try:
        results, staged = {}, {}
        for fmt in formats:
            staged[fmt], results[fmt] = export_verified(fmt, model, wrapper, x, batches, staging, out, model_id, log)
        if int8 is not None:
            results["int8"] = quantized(int8, model, data, metric, staged["onnx"], staging, out, checkpoint, log)
            staged["int8"] = staging / INT8_FILE
            if "openvino" in staged:
                results["openvino_int8"] = quantized_openvino(int8, model, data, metric, staged, staging, out,
                                                              checkpoint, log)
                staged["openvino_int8"] = staging / OPENVINO_INT8_FILE
        info = preprocessing(model, cfg.aug, classes, threshold=decision_threshold(cfg, checkpoint))
        if anomaly is not None:  # an anomaly checkpoint: its detector for predict.py --onnx (and its INT8)
            results.update(exported_detector(model, anomaly, staging, batches, write_preprocessing(staging, info),
                                             "openvino" in formats, int8, out, log))
        for key in ("int8", "openvino_int8", "anomaly", "anomaly_openvino", "anomaly_int8", "anomaly_openvino_int8"):
            if key in results:
                results[key]["model_fingerprint"] = model_id
        results = {**previous_results(out, model_id, list(results), log), **results}
        _move_in(staged, staging, out, anomaly is not None)
        write_preprocessing(out, info)
        report = dict(images=source, model_fingerprint=model_id, results=results)
        atomic_write_text(out / "verification.json", json.dumps(report, indent=1))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"wrote {out}/: {', '.join(p.name for p in staged.values())}, preprocessing.json, verification.json"
        + (f", {ANOMALY_DIR}/" if anomaly is not None else ""))
    return report


def _move_in(staged: dict, staging: Path, out: Path, anomaly: bool) -> None:
    """The verified files from `staging` to their names in `out` (an anomaly/ folder replaced whole)."""
    for path in staged.values():
        for f in _files(path):  # an IR's .bin before its .xml
            f.replace(out / f.name)
    if anomaly:
        shutil.rmtree(out / ANOMALY_DIR, ignore_errors=True)
        (staging / ANOMALY_DIR).replace(out / ANOMALY_DIR)
