"""ONNX Runtime (CPU execution provider) against PyTorch eager: our model at the same batch, size and thread
count, exported by `vit.deploy.export` (dynamo exporter, SDPA as ONNX Attention), timed interleaved after
warm-up."""

from __future__ import annotations

import statistics

import torch

from ..deploy.session import open_session
from ..models.build import create_model
from ..utils.timing import interleaved, ratio_stats

__all__ = ["bench_onnxruntime", "format_onnxruntime_report"]


def bench_onnxruntime(model: str, batch_size: int = 32, img_size: int = 224, warmup: int = 2, repeats: int = 5,
                      iters: int = 1, model_kwargs: dict | None = None) -> dict:
    """Images/s of `model` (random weights) in PyTorch eager and in ONNX Runtime, and the ratio
    onnxruntime/pytorch per paired repeat. Without the export extra: ValueError saying what to install."""
    import contextlib
    import io
    import tempfile
    import warnings

    from ..deploy.export import ExportableClassifier, export_model, require_onnx

    require_onnx()
    import onnxruntime as ort

    torch.manual_seed(0)
    net = create_model(model, **dict(model_kwargs or {}, img_size=img_size)).eval()
    x = torch.randn(batch_size, 3, img_size, img_size)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        path = export_model(ExportableClassifier(net), "onnx", tmp, x)
        session = open_session(path, torch.get_num_threads(), inter_op_threads=1)  # the same cores as torch
    feed = {"x": x.numpy()}

    def eager():
        with torch.inference_mode():
            net(x)

    times = interleaved({"pytorch": eager, "onnxruntime": lambda: session.run(None, feed)}, warmup, repeats,
                        iters).wall
    out = {k: dict(images_per_s=batch_size / statistics.median(t), seconds_all=t) for k, t in times.items()}
    return dict(model=model, batch_size=batch_size, img_size=img_size, threads=torch.get_num_threads(),
                ort_version=ort.__version__, **out,
                ratio_onnxruntime_over_pytorch=ratio_stats(times["onnxruntime"], times["pytorch"]))


def format_onnxruntime_report(o: dict) -> str:
    """`bench_onnxruntime`'s result as the line benchmark.py prints."""
    r = o["ratio_onnxruntime_over_pytorch"]
    return (f"\n{o['model']}  batch {o['batch_size']}  {o['img_size']} px  CPU fp32  {o['threads']} threads: "
            f"PyTorch eager {o['pytorch']['images_per_s']:.1f} img/s, ONNX Runtime {o['ort_version']} "
            f"{o['onnxruntime']['images_per_s']:.1f} img/s, ratio onnxruntime/pytorch "
            f"{r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f})")
