"""The deployment table: per model, PyTorch eager fp32 against ONNX Runtime fp32, INT8 dynamic and static, and
token merging, per batch and thread count, every variant of one (model, threads, batch) timed in one
interleaved run."""

from __future__ import annotations

import contextlib
import copy
import io
import os
import statistics
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from ..models.build import create_model
from ..utils.timing import interleaved, ratio_stats

__all__ = ["EDGE_HEADER", "bench_edge", "format_edge_rows"]

EDGE_HEADER = (f"{'model':<29}{'thr':>3}{'bs':>4}  {'variant':<26}{'img/s':>9}{'x eager (min-max)':>19}"
               f"{'cpu x eager':>19}{'MiB':>8}{'top-1':>8}")


@contextlib.contextmanager
def _quiet():
    """The exporter's and quantizer's chatter (stdout, warnings) kept off the table."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _checkpoint_data(checkpoint: str) -> tuple[str, torch.nn.Module, dict]:
    """The checkpoint's model (plain), its validation images and labels, and up to 64 training images to
    calibrate static INT8 with, all through its evaluation preprocessing."""
    import numpy as np

    from ..data import build_datasets
    from ..data.transforms import build_transform
    from ..models.checkpoint import load_checkpoint

    base, cfg, classes, _ = load_checkpoint(checkpoint)
    base.set_token_reduction(None)
    t = build_transform(cfg.aug, cfg.model.img_size, train=False)
    train, val, _ = build_datasets(cfg, check_images=False, classes=classes)
    train.transform = val.transform = t
    data = dict(x=torch.stack([val[i][0] for i in range(len(val))]).numpy(),
                y=np.array([int(val[i][1]) for i in range(len(val))]),
                calib=torch.stack([train[i][0] for i in range(min(64, len(train)))]).numpy())
    return cfg.model.name + f" ({checkpoint})", base, data


def bench_edge(models: list[str], batches: list[int] = (1, 16), threads: list[int] = (1, 2),
               merge: list[str] = ("merge:8",), warmup: int = 2, repeats: int = 5, iters: int = 1,
               checkpoint: str | None = None, on_rows: Callable[[list[dict]], object] | None = None) -> dict:
    """For each of `models` (random weights), PyTorch eager fp32 against ONNX Runtime fp32, INT8 dynamic and
    static (vit.deploy.quantize, no fallback: the raw methods), and per `merge` spec the merged model in eager,
    ONNX Runtime fp32 and INT8 dynamic; every variant of one (model, threads, batch) timed in one interleaved
    run, ratios against eager from its paired repeats (at one thread also in the calling thread's CPU time).
    Sizes are the files' bytes; top-1 on the checkpoint's validation split with `checkpoint` (its model then
    replaces `models`). `on_rows` is handed each (model, threads, batch)'s rows as they are measured."""
    import tempfile

    import numpy as np

    from ..deploy.export import require_onnx
    from ..deploy.quantize import OnnxModel

    require_onnx()
    data = None
    if checkpoint:
        name, model, data = _checkpoint_data(checkpoint)
        todo = [(name, model)]
    else:
        todo = [(name, None) for name in models]
    out = []
    for name, model in todo:
        torch.manual_seed(0)
        model = (model or create_model(name)).eval()
        chans, img = model.in_chans, model.patch_embed.img_size[0]
        calib = data["calib"] if data else np.random.default_rng(0).normal(0, 1, (16, chans, img, img)).astype(
            np.float32)
        eager = {"eager fp32": model}
        for spec in merge:
            merged = copy.deepcopy(model)
            merged.set_token_reduction(spec)
            eager[f"eager fp32 {spec}"] = merged
        with tempfile.TemporaryDirectory() as tmp:
            files = _onnx_variants(eager, merge, calib, Path(tmp), torch.randn(2, chans, img, img))
            sizes = {k: p.stat().st_size for k, p in files.items()}
            top1 = _top1(eager, files, data) if data else {}
            for n_threads in threads:
                torch.set_num_threads(n_threads)
                sessions = {k: OnnxModel(p, n_threads) for k, p in files.items()}
                for batch in batches:
                    rows = _time_variants(name, eager, sessions, n_threads, batch, chans, img, warmup, repeats,
                                          iters)
                    for r in rows:
                        k = r["variant"]
                        r.update(mib=sizes.get(k, sizes["ort fp32"] if "merge" not in k else None), top1=top1.get(k))
                    out += rows
                    if on_rows is not None:
                        on_rows(rows)
    return dict(rows=out, ort_version=__import__("onnxruntime").__version__, load_average=os.getloadavg(),
                checkpoint=checkpoint, repeats=repeats)


def _onnx_variants(eager: dict[str, torch.nn.Module], merge: list[str], calib, tmp: Path,
                   example: torch.Tensor) -> dict[str, Path]:
    """The ONNX files of the table: the plain model in fp32, INT8 dynamic and static (calibrated on `calib`), and
    per merge spec the merged model in fp32 and INT8 dynamic, written under `tmp`."""
    from ..deploy.export import ExportableClassifier, export_model
    from ..deploy.quantize import quantize

    with _quiet():
        files = {"ort fp32": export_model(ExportableClassifier(eager["eager fp32"]), "onnx", tmp / "plain", example)}
        files["ort int8 dynamic"] = quantize(files["ort fp32"], tmp / "dyn.onnx", "dynamic")
        files["ort int8 static"] = quantize(files["ort fp32"], tmp / "static.onnx", "static", calib=calib)
        for i, spec in enumerate(merge):
            m = export_model(ExportableClassifier(eager[f"eager fp32 {spec}"]), "onnx", tmp / f"merged{i}", example)
            files[f"ort fp32 {spec}"] = m
            files[f"ort int8 dynamic {spec}"] = quantize(m, tmp / f"mdyn{i}.onnx", "dynamic")
    return files


def _top1(eager: dict[str, torch.nn.Module], files: dict[str, Path], data: dict) -> dict[str, float]:
    """Every variant's top-1 on the checkpoint's validation images (`data["x"]`, labels `data["y"]`)."""
    from ..deploy.quantize import OnnxModel

    top1 = {}
    for k, mdl in eager.items():
        with torch.inference_mode():
            logits = torch.cat([mdl(torch.from_numpy(data["x"][i:i + 64])) for i in range(0, len(data["x"]), 64)])
        top1[k] = float((logits.argmax(-1).numpy() == data["y"]).mean())
    for k, p in files.items():
        top1[k] = float((OnnxModel(p)(data["x"]).argmax(-1) == data["y"]).mean())
    return top1


def _time_variants(name, eager, sessions, threads, batch, chans, img, warmup, repeats, iters) -> list[dict]:
    """One interleaved run of every eager model and ONNX Runtime session on a random batch: one row each."""
    x = torch.randn(batch, chans, img, img)
    xn = x.numpy()

    def run_eager(mdl):
        def call():
            with torch.inference_mode():
                mdl(x)
        return call

    calls = {**{k: run_eager(m) for k, m in eager.items()},
             **{k: (lambda s=s: s(xn, batch)) for k, s in sessions.items()}}
    t = interleaved(calls, warmup, repeats, iters)
    # With one thread, everything runs on the calling thread, so its CPU time is the time the model computed,
    # without the waits for a core of a shared machine (load > cores): the steadier ratio there. With more
    # threads the CPU time leaves the other threads out: not recorded.
    return [dict(model=name, threads=threads, batch=batch, variant=k,
                 images_per_s=batch / statistics.median(t.wall[k]),
                 x_eager=ratio_stats(t.wall[k], t.wall["eager fp32"]),
                 cpu_x_eager=ratio_stats(t.cpu[k], t.cpu["eager fp32"]) if threads == 1 else None)
            for k in calls]


def format_edge_rows(rows: list[dict]) -> str:
    """`bench_edge`'s rows as the lines benchmark.py prints under EDGE_HEADER."""
    lines = []
    for r in rows:
        sp, top1 = r["x_eager"], r["top1"]
        size = "" if r["mib"] is None or r["variant"].startswith("eager") else f"{r['mib'] / 2**20:.1f}"
        cpu = r.get("cpu_x_eager")
        cpu = "" if cpu is None else f"{cpu['median']:.2f} ({cpu['min']:.2f}-{cpu['max']:.2f})"
        lines.append(f"{r['model'][:28]:<29}{r['threads']:>3}{r['batch']:>4}  {r['variant']:<26}"
                     f"{r['images_per_s']:>9.1f}{sp['median']:>7.2f} ({sp['min']:.2f}-{sp['max']:.2f})"
                     f"{cpu:>19}{size:>8}{'' if top1 is None else f'{100 * top1:.2f}':>8}")
    return "\n".join(lines)
