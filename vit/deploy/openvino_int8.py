"""INT8 for OpenVINO by NNCF's post-training quantization, kept within the same accuracy budget as ONNX INT8.

    data = labelled_images(cfg, classes)                   # vit/deploy/int8.py: the images the ONNX INT8 path uses
    res = quantize_openvino("model.xml", "model.int8.xml", model, data, metric="top1", max_drop=0.5)

`nncf.quantize` on the fp32 IR, calibrated on `data.calib` (the training images that calibrate static ONNX INT8),
with NNCF's transformer recipe (`ModelType.TRANSFORMER`: SmoothQuant on the linear layers' inputs, softmax and
LayerNorm left float) and the MIXED preset (symmetric weights, asymmetric activations). The budget is ONNX INT8's:
the points of one metric (vit/deploy/quantize.py's `score`, `within_budget`) on `data.x` against the fp32 IR,
recorded with the same keys as vit/deploy/quantize.py's `quantize_within_budget` (`{metric}_fp32`,
`{metric}_int8`, `drop_points`, agreements with fp32 and PyTorch). NNCF's one attempt is taken or refused: there is
no per-layer fallback as on ONNX Runtime. Speed: batch 1, interleaved with ONNX Runtime fp32 (and ONNX Runtime INT8
when given), wall-clock ratios only (OpenVINO computes in its own threads, so the caller's CPU time says nothing).
"""

from __future__ import annotations

import contextlib
import io
import logging
import statistics
from pathlib import Path

import numpy as np

from ..utils.timing import interleaved, ratio_stats
from .int8 import LabelledImages, torch_probabilities
from .openvino_ir import ir_bytes, open_openvino, require_openvino, weights_of
from .quantize import METRICS, OnnxModel, QuantizeError, decisions, probabilities, score, within_budget

__all__ = ["OpenVinoModel", "nncf_quantize", "quantize_here", "quantize_openvino", "openvino_speed"]


class OpenVinoModel:
    """An IR on OpenVINO's CPU runtime with a fixed thread count, as vit.deploy.quantize.OnnxModel: numpy in, logits
    out, `batch` images a call."""

    def __init__(self, xml: str | Path, threads: int = 1) -> None:
        self.session = open_openvino(xml, threads)
        self.input = self.session.get_inputs()[0].name

    def __call__(self, x: np.ndarray, batch: int = 64) -> np.ndarray:
        out = [self.session.run(None, {self.input: np.ascontiguousarray(x[i:i + batch], dtype=np.float32)})[0]
               for i in range(0, len(x), batch)]
        return np.concatenate(out)


def nncf_quantize(fp32: str | Path, dst: str | Path, calib: np.ndarray) -> Path:
    """`fp32` (an IR) quantized by NNCF on `calib` (M, C, H, W), 8 images a batch, saved at `dst` (+ .bin) under
    temporary names first. NNCF runs in a child process (`quantize_here`): with torch installed it imports
    nncf.torch, which wraps torch's operators for the rest of the process, and a torch export or an OpenVINO session
    after it in the same process could crash (a segmentation fault in the test suite). Its progress bars and notes
    stay off the terminal; its failures are one sentence."""
    import importlib.util
    import os
    import subprocess
    import sys

    require_openvino("OpenVINO INT8")
    if importlib.util.find_spec("nncf") is None:
        raise QuantizeError("OpenVINO INT8 needs the nncf package, which is not installed; run pip install -e "
                            "'.[openvino]' (or pip install nncf).")
    if not len(calib):
        raise QuantizeError("OpenVINO INT8 needs calibration images; pass some (--calibration-images).")
    dst = Path(dst)
    tmp, data = dst.with_name(f".tmp-{dst.name}"), dst.with_name(f".tmp-{dst.stem}-calibration.npy")
    np.save(data, np.ascontiguousarray(calib, dtype=np.float32), allow_pickle=False)
    root = str(Path(__file__).resolve().parents[2])  # the child imports this package from where the parent did
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    code = "import sys; from vit.deploy.openvino_int8 import quantize_here; sys.exit(quantize_here(*sys.argv[1:]))"
    try:
        r = subprocess.run([sys.executable, "-c", code, str(fp32), str(tmp), str(data)], capture_output=True,
                           text=True, env=env)
    finally:
        data.unlink(missing_ok=True)
    if r.returncode != 0:
        said = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        raise QuantizeError(f"NNCF could not quantize {fp32}: {(said[-1] if said else f'exit {r.returncode}')[:300]}")
    weights_of(tmp).replace(weights_of(dst))
    tmp.replace(dst)
    return dst


def quantize_here(fp32: str, out: str, calibration: str) -> int:
    """nncf_quantize's child: the IR at `fp32` quantized on the images in the .npy file `calibration`, saved at
    `out`; 0, or 2 with the reason as the last line of stderr."""
    import sys

    import nncf
    import openvino as ov

    nncf.set_log_level(logging.ERROR)
    calib = np.load(calibration, allow_pickle=False)
    batches = [calib[i:i + 8] for i in range(0, len(calib), 8)]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            q = nncf.quantize(ov.Core().read_model(fp32), nncf.Dataset(batches), subset_size=len(calib),
                              preset=nncf.QuantizationPreset.MIXED, model_type=nncf.ModelType.TRANSFORMER)
    except Exception as e:  # NNCF's own failures (an unsupported graph)
        print(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__, file=sys.stderr)
        return 2
    ov.save_model(q, out, compress_to_fp16=False)
    return 0


def quantize_openvino(fp32: str | Path, dst: str | Path, model, data: LabelledImages, metric: str = "top1",
                      max_drop: float = 0.5, threshold: float = 0.5, threads: int = 1,
                      ort: dict[str, str | Path] | None = None, log=print) -> dict:
    """`fp32`'s INT8 IR at `dst` by NNCF, kept only when `metric` on `data` loses at most `max_drop` points against
    `fp32` on OpenVINO; -> the numbers verification.json records (quantize_within_budget's keys, method "nncf",
    and `speed`). Over the budget: QuantizeError, one sentence, the file moved to <dst>.rejected (with its .bin).
    `model`: the PyTorch model, for agreement. `ort`: ONNX Runtime files to time beside it ({"fp32": model.onnx,
    "int8": model.int8.onnx}; fp32 needed for the speed ratios)."""
    if metric not in METRICS:
        raise QuantizeError(f"unknown INT8 budget metric {metric!r}; choose one of {', '.join(METRICS)}.")
    fp32, dst, name = Path(fp32), Path(dst), METRICS[metric]
    p_torch = torch_probabilities(model, data.x, metric)
    log(f"OpenVINO INT8 (NNCF): {name} on {data.source}, budget: lose at most {max_drop:g} pt")
    nncf_quantize(fp32, dst, data.calib)
    logits_fp32, logits = OpenVinoModel(fp32)(data.x), OpenVinoModel(dst)(data.x)
    s_fp32, s = score(logits_fp32, data.y, metric, threshold), score(logits, data.y, metric, threshold)
    p_fp32, p = probabilities(logits_fp32, metric), probabilities(logits, metric)

    def agree(ref: np.ndarray) -> float:
        same = decisions(p, metric, threshold) == decisions(ref, metric, threshold)
        return float(same.reshape(len(p), -1).all(-1).mean())

    res = {"metric": metric, f"{metric}_fp32": s_fp32, f"{metric}_int8": s, "drop_points": 100 * (s_fp32 - s),
           "agreement_with_fp32": agree(p_fp32), "max_abs_prob_diff_fp32": float(np.abs(p - p_fp32).max()),
           "agreement_with_torch": agree(p_torch), "max_abs_prob_diff_torch": float(np.abs(p - p_torch).max()),
           "images": int(len(data.y)), "method": "nncf", "evaluated_on": data.source, "max_drop": max_drop,
           "calibration_images": int(len(data.calib))}
    if metric != "top1":
        res["threshold"] = threshold
    if not within_budget(res["drop_points"], max_drop):
        for f in (weights_of(dst), dst):
            f.replace(f.with_name(f"{f.name}.rejected"))
        raise QuantizeError(f"NNCF INT8 loses {res['drop_points']:.2f} {name} points on {data.source} "
                            f"({100 * s_fp32:.2f}% -> {100 * s:.2f}%), over the budget of {max_drop:g}.")
    res["bytes_fp32"], res["bytes_int8"] = ir_bytes(fp32), ir_bytes(dst)
    res["size_ratio"] = res["bytes_fp32"] / res["bytes_int8"]
    if ort and "fp32" in ort:
        res["speed"] = openvino_speed(fp32, dst, ort, data.x[:1], threads)
    return dict(res, file=str(dst))


def openvino_speed(fp32: str | Path, int8: str | Path, ort: dict[str, str | Path], x: np.ndarray, threads: int = 1,
                   repeats: int = 7, min_seconds: float = 0.2) -> dict:
    """Images/s of OpenVINO fp32 and INT8 and of ONNX Runtime's `ort` files ({"fp32": ..., "int8": ...}) at the
    batch of `x`, timed interleaved after warm-up (vit/utils/timing.py), and how many times faster OpenVINO is than
    ONNX Runtime at the same precision, and INT8 than fp32 (medians with min-max over the paired repeats)."""
    models = {"ov_fp32": OpenVinoModel(fp32, threads), "ov_int8": OpenVinoModel(int8, threads),
              **{f"ort_{k}": OnnxModel(p, threads) for k, p in ort.items()}}
    calls = {k: (lambda m=m: m(x)) for k, m in models.items()}
    for fn in calls.values():  # warm-up, and how many calls make one timed repeat
        fn()
    t = interleaved({"ort_fp32": calls["ort_fp32"]}, 0, 1)
    n = max(1, int(min_seconds / max(t.wall["ort_fp32"][0], 1e-6)))
    wall = interleaved(calls, 0, repeats, n).wall
    res = dict(batch=len(x), threads=threads, repeats=repeats,
               images_per_s={k: len(x) / statistics.median(v) for k, v in wall.items()},
               ov_fp32_over_ort_fp32=ratio_stats(wall["ov_fp32"], wall["ort_fp32"]),
               ov_int8_over_ort_fp32=ratio_stats(wall["ov_int8"], wall["ort_fp32"]),
               ov_int8_over_ov_fp32=ratio_stats(wall["ov_int8"], wall["ov_fp32"]))
    if "ort_int8" in wall:
        res["ov_int8_over_ort_int8"] = ratio_stats(wall["ov_int8"], wall["ort_int8"])
    return res
