"""Deployment: ONNX, TorchScript and torch.export (`export`, each checked against the eager model), ONNX Runtime
INT8 within a top-1 budget (`quantize`), the evaluation preprocessing from preprocessing.json without torch
(`preprocess`) and an ONNX Runtime classifier built on it (`onnx_predict`). Import by module."""
