"""Deployment: ONNX, TorchScript and torch.export (`export`, each checked against the eager model), ONNX Runtime
INT8 within a top-1 budget (`quantize`), the evaluation preprocessing from preprocessing.json without torch
(`preprocess`), an ONNX Runtime classifier built on it (`onnx_predict`), and `publish` (a checkpoint folder to
the Hugging Face hub). Import by module."""
