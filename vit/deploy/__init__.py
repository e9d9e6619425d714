"""Deployment: ONNX, TorchScript and torch.export (`export`, each checked against the eager model; `export_folder`:
export.py's folder, all or nothing), ONNX Runtime INT8 within an accuracy budget (`quantize`; `int8`: export.py
--quantize int8's steps as functions), the evaluation preprocessing from preprocessing.json without torch
(`preprocess`), an ONNX Runtime classifier built on it (`onnx_predict`), an exported detector's scores and maps
(`onnx_anomaly`: PatchCore, AnomalyDINO, Dinomaly), the detector exported and checked (`anomaly_export`) and its
INT8 within an image-AUROC budget (`anomaly_int8`), prediction rows (`predictions`, torch-free) and the PyTorch
predictor (`predict`), every ONNX Runtime session (`session`), OpenVINO IR converted from the ONNX file with a CPU
session called as ONNX Runtime's (`openvino_ir`, torch-free) and its NNCF INT8 within the same budget
(`openvino_int8`), segmentation's predictor (`seg_predict`), the files it writes (`seg_outputs`: masks, overlays,
areas; torch-free) and its ONNX export with a torch-free predictor (`onnx_segment`), and `publish` (a checkpoint
folder to the Hugging Face hub). Import by module."""

_LAZY = {"export_folder": "export_folder", "predict_images": "predict", "predict_sentences": "predict",
         "predict_onnx_images": "predictions"}


def __getattr__(name: str):  # each loads with its module on first use: predict_onnx_images stays torch-free
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
