"""Evaluation: `metrics` (predictions gathered over processes, accuracy, calibration, per-class scores),
`multilabel` (per-class AP, mAP, F1), `inference` (images to predictions: which files, which model and
preprocessing), `evaluate` (evaluate.py's scoring: `evaluate_checkpoint`, also importable from here, loaded on first
use), `text` (sentences to predictions), `zero_shot` (CLIP / SigLIP classifiers from label names), `features`
(frozen embeddings out) and `probes` (k-NN and the linear probe on them), `anomaly` (PatchCore, AnomalyDINO) with
`anomaly_settings` (its patchcore.json), `dinomaly` (Dinomaly), `anomaly_threshold` (thresholds from validation
images), `anomaly_metrics` (image and pixel AUROC, AUPRO), `anomaly_tiles` (large images scored in tiles),
`segmentation` (mIoU, per-class IoU, Dice, pixel AUROC, sliding windows), and `plots`. Import by module."""

_LAZY = {"evaluate_checkpoint": "evaluate", "evaluate_model": "evaluate", "load_model_and_config": "inference"}


def __getattr__(name: str):  # torch loads with the module that needs it, not with `import vit.eval`
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
