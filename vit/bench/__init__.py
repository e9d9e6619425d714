"""benchmark.py's measurements, one module per mode, each a public function returning a dict (what `--out` writes) and a
`format_*` function for its table: `model` (ours against timm's same-named model, and the token-scaling table),
`data` (the input pipeline), `runtime` (ONNX Runtime against PyTorch eager), `edge` (the deployment table),
`token_reduction` (ToMe / EViT against the plain model), `sparse` (dense against sparse attention), `clip` (CLIP /
SigLIP against open_clip on the same weights), `probes` (the linear probe against scikit-learn's LogisticRegression);
`sides` holds what they measure a model with, and `vit.utils.timing` the interleaved timing they share. Import by
module (`from vit.bench.model import bench_model`); this `__init__` imports nothing."""
