"""Deployment: ONNX and TorchScript `export`, checked against the eager model. Import by module."""
