"""Deployment: ONNX and TorchScript `export`, checked against the eager model, and `publish` (a checkpoint folder
to the Hugging Face hub). Import by module."""
