"""Evaluation: `metrics` (predictions gathered over processes, accuracy, calibration, per-class scores),
`multilabel` (per-class AP, mAP, F1), `inference` (images to predictions: which files, which model and
preprocessing), `text` (sentences to predictions), `zero_shot` (CLIP / SigLIP classifiers from label names),
`features` (frozen embeddings out) and `probes` (k-NN and the linear probe on them), `anomaly` (PatchCore) with
`anomaly_settings` (its patchcore.json), and `plots`. Import by module."""
