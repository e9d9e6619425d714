"""INT8 as `export.py --quantize int8` makes it, for Python users too: labelled images, the budget, the method.

    data = labelled_images(cfg, classes)                      # the checkpoint's validation split (or a folder)
    res = quantize_int8("model.onnx", "model.int8.onnx", model, data, metric=budget_metric(cfg), max_drop=0.5)

`quantize_int8` runs vit/deploy/quantize.py's `quantize_within_budget` for each method asked (dynamic, static),
times the ones that keep the budget against the PyTorch model and keeps the fastest (`choose_method`). The
budget is in points of one metric on labelled images: top-1 for a single-label model, mAP (default) or micro-F1
for a multi-label one. Top-1 moves in steps of one image, 100 / N points on N images: a budget finer than that
only passes an INT8 model that changes no answer, which `resolution_warning` says.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..data import DataError, build_datasets
from ..data.base import image_files
from ..data.transforms import build_transform
from ..eval.inference import ImageFiles
from .quantize import METRICS, QuantizeError, probabilities, quantize_within_budget, signed_points, speed_ratios

__all__ = ["INT8_FILE", "LabelledImages", "samples", "labelled_images", "budget_metric", "describe_change",
           "resolution_warning", "choose_method", "torch_probabilities", "quantize_int8"]

INT8_FILE = "model.int8.onnx"


@dataclass
class LabelledImages:
    """Preprocessed float32 arrays: x (N, C, H, W) with labels y, (N,) class ids or (N, C) multi-hot; the
    calibration images calib (M, C, H, W); and a phrase saying where they came from."""

    x: np.ndarray
    y: np.ndarray
    calib: np.ndarray
    source: str


def samples(ds, n: int | None = None):
    """(image, label) pairs of a dataset, map-style or a shard stream (`data.dataset: wds`, which cannot be
    indexed), without the padding and unreadable samples a shard reader marks with a negative index."""
    items = (ds[i] for i in range(len(ds))) if hasattr(ds, "__getitem__") and not isinstance(
        ds, torch.utils.data.IterableDataset) else iter(ds)
    good = (item[:2] for item in items if len(item) < 3 or item[2] >= 0)
    return itertools.islice(good, n)


def labelled_images(cfg, classes: list[str], eval_images: str | Path | None = None,
                    calibration_images: int = 64) -> LabelledImages:
    """The images INT8 is measured and calibrated on, through the model's evaluation preprocessing: the
    validation split of `cfg` (calibrated on its training split), or `eval_images`, a folder of
    <class>/<image> (single-label only; calibrated on its own images). DataError, one sentence, otherwise."""
    transform = build_transform(cfg.aug, cfg.model.img_size, train=False)
    multi_label = bool(cfg.data.labels_file)
    if eval_images is not None:
        root = Path(eval_images)
        if multi_label:
            raise DataError(f"--eval-images {root} gives one class per image (its folder), but this model is "
                            "multi-label; drop --eval-images to measure on the checkpoint's validation split.")
        missing = [c for c in classes if not (root / c).is_dir()]
        if not root.is_dir() or len(missing) == len(classes):
            raise DataError(f"--eval-images {root} has no class folders named as the model's classes "
                            f"({', '.join(classes[:3])}, ...); put each image in <folder>/<class>/.")
        paths, labels = [], []
        for k, c in enumerate(classes):
            found = sorted(image_files(root / c)) if (root / c).is_dir() else []
            paths += found
            labels += [k] * len(found)
        ds = ImageFiles(paths, transform, cfg.model.in_chans)
        pairs = [(x, y) for (x, ok, _), y in zip((ds[i] for i in range(len(ds))), labels) if ok]
        source = f"{root}"
    else:
        _, val, _ = build_datasets(cfg, check_images=False, splits=("val",), classes=classes)
        val.transform = transform  # evaluation preprocessing has no randomness
        pairs = list(samples(val))
        source = f"the {cfg.data.dataset} validation split"
    if not pairs:
        raise DataError(f"no readable labelled image in {source}; INT8 needs images to measure its budget on.")
    x = torch.stack([p[0] for p in pairs]).numpy()
    y = (np.stack([np.asarray(p[1], dtype=np.float32) for p in pairs]) if multi_label
         else np.array([int(p[1]) for p in pairs]))
    source = f"{source} ({len(pairs)} images)"
    if eval_images is None:  # calibration: the training split, as the model saw it
        train, _, _ = build_datasets(cfg, check_images=False, splits=("train",), classes=classes)
        train.transform = transform
        calib = torch.stack([p[0] for p in samples(train, calibration_images)]).numpy()
    else:
        calib = x[np.random.default_rng(0).permutation(len(x))[:calibration_images]]
        source += ", also the calibration images"
    return LabelledImages(x, y, calib, source)


def budget_metric(cfg, requested: str | None = None) -> str:
    """The budget's metric for the model `cfg` describes: `requested`, else top1 (single-label) or map
    (multi-label: the metric training selects checkpoints by). A metric of the other kind is one sentence."""
    multi_label = bool(cfg.data.labels_file)
    metric = requested or ("map" if multi_label else "top1")
    if metric not in METRICS:
        raise QuantizeError(f"unknown INT8 budget metric {metric!r}; choose one of {', '.join(METRICS)}.")
    if multi_label == (metric == "top1"):
        kind, fits = ("multi-label", "map or micro_f1") if multi_label else ("single-label", "top1")
        raise QuantizeError(f"the INT8 budget metric {metric} does not fit a {kind} model; use {fits}.")
    return metric


def describe_change(metric: str, fp32: float, int8: float, max_drop: float, images: int) -> str:
    """'top-1 63.08% -> 64.62% (+1.54 pt, a gain; budget: lose at most 0.5 pt; 65 images, one image =
    1.54 pt)': the change signed as INT8 minus fp32, so a gain reads as one."""
    change = 100 * (int8 - fp32)
    word = "a gain" if change > 5e-5 else "a loss" if change < -5e-5 else "no change"
    step = f", one image = {100 / images:.2f} pt" if metric == "top1" else ""
    return (f"{METRICS[metric]} {100 * fp32:.2f}% -> {100 * int8:.2f}% ({signed_points(change)}, {word}; "
            f"budget: lose at most {max_drop:g} pt; {images} images{step})")


def resolution_warning(metric: str, max_drop: float, images: int) -> str | None:
    """A sentence when a top-1 budget is finer than one image of the evaluation set (then it admits only an
    INT8 model that loses no image), else None. A budget of 0 asks exactly that: no warning."""
    one = 100 / images
    if metric != "top1" or not 0 < max_drop < one:
        return None
    return (f"warning: the budget of {max_drop:g} pt is finer than one of the {images} evaluation images "
            f"({one:.2f} pt), so INT8 passes only if it loses no image; evaluate on more images (--eval-images) "
            f"for a finer budget, or set it to 0 to say so.")


def choose_method(candidates: dict[str, dict], speeds: dict[str, dict]) -> str:
    """Of the methods that kept the budget (`candidates`), the fastest against PyTorch eager at batch 1 (at one
    thread by CPU time, steadier on a shared machine; `speed_ratios`'s numbers)."""
    key = "int8_over_eager_fp32"
    key = f"cpu_{key}" if all(f"cpu_{key}" in speeds[m] for m in candidates) else key
    return max(candidates, key=lambda m: speeds[m][key]["median"])


def torch_probabilities(model: torch.nn.Module, x: np.ndarray, metric: str) -> np.ndarray:
    """The PyTorch model's probabilities on `x` (N, C, H, W), 64 images a batch, as `metric` reads them (softmax,
    sigmoids, or per pixel): what the INT8 files' agreement is counted against."""
    with torch.no_grad():
        logits = torch.cat([model(torch.from_numpy(x[i:i + 64])) for i in range(0, len(x), 64)])
    return probabilities(logits.numpy(), metric)


def quantize_int8(fp32: str | Path, dst: str | Path, model: torch.nn.Module, data: LabelledImages,
                  methods: tuple[str, ...] = ("dynamic", "static"), metric: str = "top1", max_drop: float = 0.5,
                  threshold: float = 0.5, threads: int = 1, log=print) -> dict:
    """Write the INT8 model of `fp32` to `dst` within `max_drop` points of `metric` on `data`, by the fastest of
    `methods` that keeps it; returns the numbers verification.json records. QuantizeError when none keeps it,
    the best attempt left at <dst>.rejected. `model`: the PyTorch model, for agreement and speed."""
    fp32, dst = Path(fp32), Path(dst)
    p_torch = torch_probabilities(model, data.x, metric)
    log(f"INT8 ({', '.join(methods)}): {METRICS[metric]} on {data.source}, budget: lose at most {max_drop:g} pt")
    warning = resolution_warning(metric, max_drop, len(data.x))
    if warning:
        log(warning)
    candidates, failures = {}, []
    for method in methods:
        try:
            candidates[method] = quantize_within_budget(
                fp32, dst.with_name(f"{method}-{dst.name}"), method, data.calib, data.x, data.y, max_drop, p_torch,
                log=log, metric=metric, threshold=threshold)
        except QuantizeError as e:
            failures.append(str(e))
    if not candidates:
        for method in methods:  # the best attempt, for inspection, never under the loadable name
            tried = dst.with_name(f"{method}-{dst.name}")
            if tried.is_file():
                tried.replace(dst.with_name(f"{dst.name}.rejected"))
        raise QuantizeError(" ".join(failures))
    speeds = speed_ratios(model, fp32, {m: c["file"] for m, c in candidates.items()},
                          torch.from_numpy(data.x[:1]), threads)
    best = choose_method(candidates, speeds)
    for m, c in candidates.items():
        c["speed"] = speeds[m]
    Path(candidates[best]["file"]).replace(dst)
    res = dict(candidates[best], method=best, file=str(dst), evaluated_on=data.source, max_drop=max_drop,
               calibration_images=int(len(data.calib)), rejected=failures,
               alternatives={m: {k: v for k, v in c.items() if k != "file"} for m, c in candidates.items()
                             if m != best})
    res["bytes_fp32"], res["bytes_int8"] = fp32.stat().st_size, dst.stat().st_size
    res["size_ratio"] = res["bytes_fp32"] / res["bytes_int8"]
    for m in candidates:  # the others' files; the chosen one took dst's name
        dst.with_name(f"{m}-{dst.name}").unlink(missing_ok=True)
    return res
