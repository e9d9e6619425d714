"""ONNX Runtime sessions, opened one way for every caller (the classifier, export's check, INT8, benchmarks): the
CPU provider, ONNX Runtime's own log quiet below errors. Standard library only at import (onnxruntime is imported
when a session is opened), so the torch-free predictor (`predict.py --onnx`) uses it too."""

from __future__ import annotations

from pathlib import Path

__all__ = ["open_session"]


def open_session(path: str | Path, threads: int = 0, inter_op_threads: int = 0, optimized_to: str | Path | None = None):
    """An `onnxruntime.InferenceSession` for `path` on the CPU provider. `threads`: intra-op threads (0: ONNX
    Runtime's choice, one per core); `inter_op_threads` likewise between operators; `optimized_to`: apply the basic
    graph optimizations only and write the optimized model there (the file ONNX Runtime would run)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    if inter_op_threads:
        opts.inter_op_num_threads = inter_op_threads
    if optimized_to is not None:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = str(optimized_to)
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
