"""INT8 for ONNX Runtime that keeps an accuracy budget: quantize, measure, fall back to float where it hurts.

    res = quantize_within_budget("model.onnx", "model.int8.onnx", "dynamic", calib, x_val, y_val, 0.5, p_torch)

The budget is in points of one metric (`METRICS`) measured on labelled images against the fp32 file: top-1
accuracy for a single-label classifier; for a multi-label one (a sigmoid per class) mAP, the metric training
selects checkpoints by, or micro-F1 at the decision threshold. A drop larger than the budget is refused; a gain
is always within it.

Two methods (ONNX Runtime's own quantizer, `onnxruntime.quantization`):
  dynamic  weights int8 per tensor, activations quantized at run time per tensor (`quantize_dynamic`:
           MatMulInteger / DynamicQuantizeLinear); needs no calibration.
  static   QDQ: QuantizeLinear/DequantizeLinear pairs on the inputs of every weight MatMul (outputs stay
           float), activation ranges fixed by MinMax calibration on training images (`quantize_static`, uint8
           activations, int8 weights, as ORT recommends for x86 CPUs), which ORT fuses into integer kernels
           (MatMulIntegerToFloat).
Only linear layers (MatMul/Gemm with a constant weight) are candidates; LayerNorm, softmax inside the fused
Attention node and GELU stay float, as the accuracy studies of INT8 ViTs (FQ-ViT, PTQ4ViT) find them the
sensitive parts. The patch-embedding Conv stays float too: ONNX Runtime's ConvInteger and QLinearConv are
slower on x86 than its float Conv (ViT-S/16, 1 thread: 4.7 ms against 2.4 ms), for 2% of the weights.
Before quantizing, the graph's constant subexpressions are folded (ONNX Runtime's basic optimizations, what
its `quant_pre_process` runs): the exporter leaves some weights as Slice/Transpose of an initializer (the
last block's key and value, whose query is the [CLS] token's alone), which the quantizer would otherwise
take for activations and leave float.

The fallback, measured rather than guessed: the weight nodes are grouped by the PyTorch module they came from
(the exporter records it in each node's `pkg.torch.onnx.name_scopes`: patch_embed.proj, blocks.3.mlp.fc2,
head, ...). If quantizing everything loses more than the budget, each group is quantized alone and scored by
how far its probabilities move from fp32's on the calibration images; the most sensitive groups are kept float,
the fewest that meet the budget (binary search over that ranking, `fewest_float_groups`), at most half the
groups (beyond that the file would hardly be INT8). The metric is measured on labelled images (the checkpoint's
validation split or a folder). Nothing here imports torch except `speed_ratios`, which times the PyTorch model
beside them, and the multi-label metrics (vit/eval/multilabel.py's AP and F1, the project's one definition).
"""

from __future__ import annotations

import ast
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..utils.timing import interleaved, ratio_stats
from .onnx_predict import softmax
from .session import open_session

__all__ = ["METHODS", "METRICS", "QuantizeError", "prepare", "weight_groups", "quantize", "OnnxModel",
           "probabilities", "score", "decisions", "signed_points", "within_budget", "fewest_float_groups",
           "quantize_within_budget", "speed_ratios"]

METHODS = ("dynamic", "static")
# the budget's metric -> how it is printed; top1 for single-label models, map / micro_f1 for multi-label ones,
# miou for a segmenter (logits (N, C, H, W) against masks (N, H, W), 255 ignored)
METRICS = {"top1": "top-1", "map": "mAP", "micro_f1": "micro-F1", "miou": "mIoU"}
WEIGHT_OPS = ("MatMul", "Gemm")  # not Conv: see the module docstring
SENSITIVITY_IMAGES = 64  # calibration images that rank the groups


class QuantizeError(ValueError):
    """No INT8 model keeps the budget, or quantization itself failed; the message says which."""


def _scope(node) -> str:
    """The PyTorch module a node came from ('blocks.3.mlp.fc2'), from the exporter's metadata; else its name."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            try:
                scopes = [s for s in ast.literal_eval(prop.value) if isinstance(s, str) and s.startswith("model.")]
            except (ValueError, SyntaxError):
                break
            if scopes:
                return scopes[-1][len("model."):]
    return node.name


def prepare(src: str | Path, dst: str | Path) -> Path:
    """Write the quantizer's input: `src` with its constant subexpressions folded (ONNX Runtime's basic,
    hardware-independent optimizations: exact) and without the exporter's recorded intermediate shapes, which
    trip the quantizer's strict shape inference (the head's transposed Gemm weight: "(32) vs (5)"); they are
    only hints. Node names are kept, so `weight_groups(dst, scopes_from=src)` names the groups."""
    import onnx

    model = onnx.load(str(src))
    del model.graph.value_info[:]
    dst = Path(dst)
    bare = dst.with_name(f".bare-{dst.name}")
    onnx.save(model, str(bare))
    try:
        open_session(bare, optimized_to=dst)
    finally:
        bare.unlink(missing_ok=True)
    return dst


def weight_groups(path: str | Path, scopes_from: str | Path | None = None) -> dict[str, list[str]]:
    """{module name: [node names]} of the nodes that multiply by a constant weight, in graph order. The
    module names come from `scopes_from` (the exported file, when `path` is its `prepare`d copy, which has
    lost the exporter's metadata), matched by node name."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    named = graph if scopes_from is None else onnx.load(str(scopes_from), load_external_data=False).graph
    scope = {n.name: _scope(n) for n in named.node}
    consts = {i.name for i in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    groups: dict[str, list[str]] = {}
    for node in graph.node:
        if node.op_type in WEIGHT_OPS and len(node.input) > 1 and node.input[1] in consts:
            groups.setdefault(scope.get(node.name, node.name), []).append(node.name)
    return groups


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over an (N, C, H, W) array, 8 images a batch."""

    def __init__(self, x: np.ndarray, name: str = "x") -> None:
        self.batches = iter([{name: x[i:i + 8]} for i in range(0, len(x), 8)])

    def get_next(self):
        return next(self.batches, None)


def quantize(src: str | Path, dst: str | Path, method: str, exclude: list[str] = (), calib: np.ndarray | None = None,
             cache: str | Path | None = None, only: list[str] | None = None, prepared: bool = False) -> Path:
    """Write the INT8 model of `src` to `dst`; nodes in `exclude` stay float (`only`: quantize just these).
    `cache`: a calibration cache file (static), so repeated calls calibrate once. `prepared`: `src` already
    went through `prepare` (the budget search prepares once for its many calls)."""
    import logging

    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static

    if method not in METHODS:
        raise QuantizeError(f"unknown INT8 method {method!r}; choose one of {', '.join(METHODS)}.")
    common = dict(op_types_to_quantize=list(WEIGHT_OPS), nodes_to_exclude=list(exclude) or None,
                  nodes_to_quantize=list(only) if only else None, weight_type=QuantType.QInt8,
                  extra_options={"MatMulConstBOnly": True})  # activation x activation products stay float
    if method == "static" and (calib is None or not len(calib)):
        raise QuantizeError("static INT8 needs calibration images; pass some (--calibration-images).")
    logging.getLogger("root").setLevel(logging.ERROR)  # the quantizer's per-node notes
    plain = Path(src) if prepared else prepare(src, Path(dst).with_name(f".plain-{Path(dst).name}"))
    try:
        if method == "dynamic":
            quantize_dynamic(str(plain), str(dst), **common)
        else:
            # outputs left float: a QDQ pair on a product's output only feeds the float ops after it (bias Add,
            # GELU, residual Add) through a DequantizeLinear; without it ONNX Runtime fuses each product into
            # MatMulIntegerToFloat, one rounding fewer (ViT-S/16 profile: QuantizeLinear, DequantizeLinear and
            # Add took 18% of the static model's time, 6% after)
            common["extra_options"]["OpTypesToExcludeOutputQuantization"] = list(WEIGHT_OPS)
            quantize_static(str(plain), str(dst), _Reader(calib), quant_format=QuantFormat.QDQ,
                            activation_type=QuantType.QUInt8, calibrate_method=CalibrationMethod.MinMax,
                            calibration_cache_path=str(cache) if cache else None, **common)
    except Exception as e:  # the quantizer's own failures (an unsupported graph): one sentence
        raise QuantizeError(f"ONNX Runtime could not quantize {src} ({method}): {str(e).splitlines()[0]}") from None
    finally:
        if not prepared:
            plain.unlink(missing_ok=True)
    return Path(dst)


class OnnxModel:
    """An ONNX file on ONNX Runtime's CPU provider, with a fixed thread count: numpy in, logits out."""

    def __init__(self, path: str | Path, threads: int = 1) -> None:
        self.session = open_session(path, threads, inter_op_threads=1)
        self.input = self.session.get_inputs()[0].name

    def __call__(self, x: np.ndarray, batch: int = 64) -> np.ndarray:
        out = [self.session.run(None, {self.input: np.ascontiguousarray(x[i:i + batch], dtype=np.float32)})[0]
               for i in range(0, len(x), batch)]
        return np.concatenate(out)


def probabilities(logits: np.ndarray, metric: str) -> np.ndarray:
    """(N, C) probabilities: softmax for a single-label metric, a sigmoid per class for a multi-label one;
    (N, C, H, W) for a segmenter's, softmax over the classes of each pixel."""
    if metric == "top1":
        return softmax(logits, np.float64)
    if metric == "miou":
        return np.moveaxis(softmax(np.moveaxis(logits, 1, -1), np.float64), -1, 1)
    return 1 / (1 + np.exp(-logits.astype(np.float64)))


def score(logits: np.ndarray, y: np.ndarray, metric: str, threshold: float = 0.5) -> float:
    """The budget's metric as a fraction: top-1 accuracy (y: (N,) class ids), or mAP over the classes with a
    positive / micro-F1 at `threshold` (y: (N, C) multi-hot)."""
    if metric == "top1":
        return float((logits.argmax(-1) == y).mean())
    import torch

    if metric == "miou":  # vit/eval/segmentation.py's definition: classes neither true nor predicted left out
        from ..eval.segmentation import confusion, seg_scores

        pred = torch.from_numpy(logits.argmax(1))
        return float(seg_scores(confusion(pred, torch.from_numpy(np.asarray(y)), logits.shape[1]))["miou"])

    from ..eval.multilabel import average_precision, f1_at

    p, t = torch.from_numpy(probabilities(logits, metric)), torch.from_numpy(np.asarray(y, dtype=np.float64))
    if metric == "map":
        ap = average_precision(p, t)
        present = ~ap.isnan()
        return float(ap[present].mean()) if present.any() else 0.0
    return float(f1_at(p, t, threshold)["micro_f1"])


def decisions(p: np.ndarray, metric: str, threshold: float = 0.5) -> np.ndarray:
    """What the model answers per image, to count agreements: its top-1 class (N,), its label set (N, C), or a
    segmenter's class per pixel (N, H, W)."""
    if metric == "miou":
        return p.argmax(1)
    return p.argmax(-1) if metric == "top1" else p >= threshold


def signed_points(change: float) -> str:
    """A change in points with its sign, '+1.54 pt' / '-1.54 pt'; float noise below 0.00005 is '+0.00 pt', never
    '-0.00 pt'."""
    return f"{0.0 if abs(change) < 5e-5 else change:+.2f} pt"


def within_budget(drop_points: float, max_drop: float) -> bool:
    """A drop (fp32 minus INT8, in points) keeps the budget when it is at most `max_drop`; a gain always does.
    The 1e-9 absorbs float noise in points computed from equal fractions."""
    return drop_points <= max_drop + 1e-9


def fewest_float_groups(ranking: list[str], drop_with: Callable[[list[str]], float], max_drop: float
                        ) -> tuple[int | None, dict[int, float]]:
    """The fewest of the most sensitive groups (`ranking[:k]`, k from 1 to half of them) to keep float so that
    `drop_with(float groups)` keeps the budget, by binary search (the drop is nearly monotone in k). Returns
    (k or None when even the most allowed does not, {k tried: its drop})."""
    lo, hi = 1, max(1, len(ranking) // 2)  # float groups allowed: at most half
    best, tried = None, {}
    while lo <= hi:
        k = (lo + hi) // 2
        tried[k] = drop_with(ranking[:k])
        if within_budget(tried[k], max_drop):
            best, hi = k, k - 1
        else:
            lo = k + 1
    return best, tried


def quantize_within_budget(src: str | Path, dst: str | Path, method: str, calib: np.ndarray, x_eval: np.ndarray,
                           y_eval: np.ndarray, max_drop: float, p_torch: np.ndarray | None = None,
                           log=lambda s: None, metric: str = "top1", threshold: float = 0.5) -> dict:
    """Quantize `src` into `dst` with the fewest float groups that keep `metric` (on x_eval, y_eval) within
    `max_drop` points of the fp32 file's. Returns the numbers verification.json records ({metric}_fp32,
    {metric}_int8, drop_points, ...); raises QuantizeError (the last attempt left at `dst`) when no allowed
    fallback meets the budget. `p_torch`: the PyTorch model's probabilities, to count agreements with it."""
    if metric not in METRICS:
        raise QuantizeError(f"unknown INT8 budget metric {metric!r}; choose one of {', '.join(METRICS)}.")
    dst, name = Path(dst), METRICS[metric]
    cache = dst.with_name(dst.name + ".calibration.json")
    plain = prepare(src, dst.with_name(f".plain-{dst.name}"))  # once, for every attempt below
    groups = weight_groups(plain, scopes_from=src)
    if not groups:
        plain.unlink()
        raise QuantizeError(f"{src} has no linear layer to quantize.")
    logits_fp32 = OnnxModel(src)(x_eval)
    p_fp32, s_fp32 = probabilities(logits_fp32, metric), score(logits_fp32, y_eval, metric, threshold)
    tried: dict[tuple, dict] = {}

    def attempt(float_groups: list[str]) -> dict:
        exclude = [n for g in float_groups for n in groups[g]]
        quantize(plain, dst, method, exclude, calib, cache, prepared=True)
        logits = OnnxModel(dst)(x_eval)
        p, s = probabilities(logits, metric), score(logits, y_eval, metric, threshold)
        same = decisions(p, metric, threshold) == decisions(p_fp32, metric, threshold)
        res = {"metric": metric, f"{metric}_fp32": s_fp32, f"{metric}_int8": s, "drop_points": 100 * (s_fp32 - s),
               "agreement_with_fp32": float(same.reshape(len(p), -1).all(-1).mean()),
               "max_abs_prob_diff_fp32": float(np.abs(p - p_fp32).max()), "float_groups": list(float_groups),
               "quantized_groups": [g for g in groups if g not in float_groups], "images": int(len(y_eval))}
        if metric != "top1":
            res["threshold"] = threshold
        if p_torch is not None:
            same = decisions(p, metric, threshold) == decisions(p_torch, metric, threshold)
            res["agreement_with_torch"] = float(same.reshape(len(p), -1).all(-1).mean())
            res["max_abs_prob_diff_torch"] = float(np.abs(p - p_torch).max())
        log(f"  {method:<8} {len(float_groups):>2} of {len(groups)} layer group(s) float: {name} "
            f"{100 * s_fp32:.2f}% -> {100 * s:.2f}% ({signed_points(-res['drop_points'])})")
        tried[tuple(float_groups)] = res
        return res

    try:
        res = attempt([])
        if within_budget(res["drop_points"], max_drop):
            return dict(res, file=str(dst), method=method)
        p_calib = probabilities(OnnxModel(src)(calib[:SENSITIVITY_IMAGES]), metric)
        ranking = _sensitivity(plain, dst, method, groups, calib, cache, p_calib, metric)
        log(f"  {method:<8} most sensitive first: {', '.join(ranking[:6])}{', ...' if len(ranking) > 6 else ''}")
        best, drops = fewest_float_groups(ranking, lambda fl: attempt(fl)["drop_points"], max_drop)
        if best is None:
            k = max(drops)
            raise QuantizeError(f"{method} INT8 loses {drops[k]:.2f} {name} points with the {k} most sensitive of "
                                f"{len(groups)} layer groups kept float, over the budget of {max_drop:g}.")
        if best != list(drops)[-1]:  # the file on disk is the last attempt: write the chosen one again
            attempt(ranking[:best])
        return dict(tried[tuple(ranking[:best])], file=str(dst), method=method, sensitivity_ranking=ranking)
    finally:
        cache.unlink(missing_ok=True)
        plain.unlink(missing_ok=True)


def _sensitivity(src, dst, method, groups, calib, cache, p_ref, metric) -> list[str]:
    """Groups ordered by how far quantizing each alone moves the probabilities (mean |p - p_fp32|)."""
    scores = {}
    x = calib[:SENSITIVITY_IMAGES]
    for g, nodes in groups.items():
        quantize(src, dst, method, calib=calib, cache=cache, only=nodes, prepared=True)
        scores[g] = float(np.abs(probabilities(OnnxModel(dst)(x), metric) - p_ref).mean())
    return sorted(scores, key=scores.get, reverse=True)


def speed_ratios(model, fp32: str | Path, int8: dict[str, str | Path], x, threads: int = 1, repeats: int = 7,
                 min_seconds: float = 0.2) -> dict:
    """Per INT8 file: images/s and ratios against PyTorch eager fp32 (`model`, the caller's torch model) and
    ONNX Runtime fp32 at the batch of `x`, all timed interleaved (A, B, C, A, B, C, ...) after warm-up, so a
    shared CPU's load falls on every side alike; medians with min-max over the paired repeats. At one thread
    also the same ratios in the calling thread's CPU time (`cpu_*`), the steadier ones on a loaded machine."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        xn = x.numpy()
        sessions = {"ort_fp32": OnnxModel(fp32, threads), **{m: OnnxModel(p, threads) for m, p in int8.items()}}

        def eager():
            with torch.inference_mode():
                model(x)

        calls = {"eager_fp32": eager, **{k: (lambda s=s: s(xn)) for k, s in sessions.items()}}
        for fn in calls.values():  # warm-up, and how many calls make one timed repeat
            fn()
        t0 = time.perf_counter()
        calls["eager_fp32"]()
        n = max(1, int(min_seconds / max(time.perf_counter() - t0, 1e-6)))
        t = interleaved(calls, 0, repeats, n)
        times, cpu = t.wall, t.cpu
    finally:
        torch.set_num_threads(old)

    def ratio(a: str, b: str, t: dict) -> dict:  # how many times faster a is than b, per paired repeat
        return ratio_stats(t[a], t[b])

    batch = len(x)
    res = {m: dict(batch=batch, threads=threads, repeats=repeats,
                   images_per_s={k: batch / statistics.median(times[k]) for k in ("eager_fp32", "ort_fp32", m)},
                   int8_over_eager_fp32=ratio(m, "eager_fp32", times), int8_over_ort_fp32=ratio(m, "ort_fp32", times),
                   ort_fp32_over_eager_fp32=ratio("ort_fp32", "eager_fp32", times))
           for m in int8}
    if threads == 1:  # one thread computes in the caller's thread: its CPU time leaves out the waits for a core
        for m in int8:  # that a shared machine's load adds (the wall clock's ratios swing 2-50x there)
            res[m]["cpu_int8_over_eager_fp32"] = ratio(m, "eager_fp32", cpu)
            res[m]["cpu_int8_over_ort_fp32"] = ratio(m, "ort_fp32", cpu)
    return res
