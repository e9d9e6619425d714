"""ONNX Runtime sessions, opened one way for every caller (the classifier, export's check, INT8, benchmarks): the
CPU provider, ONNX Runtime's own log quiet below errors. An OpenVINO IR (a .xml) opens on OpenVINO's CPU plugin
instead, behind the same calls (`vit.deploy.openvino_ir.OpenVinoSession`). Standard library only at import (the
runtime is imported when a session is opened), so the torch-free predictor (`predict.py --onnx`) uses it too."""

from __future__ import annotations

from pathlib import Path

__all__ = ["open_session", "runtime_name"]


def runtime_name(path: str | Path) -> str:
    """The runtime a model file runs on, as a person names it: OpenVINO for an IR (.xml), else ONNX Runtime."""
    return "OpenVINO" if Path(path).suffix == ".xml" else "ONNX Runtime"


def open_session(path: str | Path, threads: int = 0, inter_op_threads: int = 0, optimized_to: str | Path | None = None):
    """An `onnxruntime.InferenceSession` for `path` on the CPU provider. `threads`: intra-op threads (0: ONNX
    Runtime's choice, one per core); `inter_op_threads` likewise between operators; `optimized_to`: apply the basic
    graph optimizations only and write the optimized model there (the file ONNX Runtime would run). A .xml (OpenVINO
    IR) opens as vit.deploy.openvino_ir.OpenVinoSession with `threads`."""
    if Path(path).suffix == ".xml":
        from .openvino_ir import open_openvino

        return open_openvino(path, threads)
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
