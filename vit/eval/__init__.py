"""Evaluation: `metrics` (predictions gathered over processes, accuracy, calibration, per-class scores),
`inference` (which files, which model and preprocessing) and `plots`. Import by module."""
