"""Evaluation: `metrics` (predictions gathered over processes, accuracy, calibration, per-class scores),
`inference` (which files, which model and preprocessing), `evaluate` (evaluate.py's scoring: `evaluate_checkpoint`,
also importable from here, loaded on first use) and `plots`. Import by module."""

_LAZY = {"evaluate_checkpoint": "evaluate", "evaluate_model": "evaluate", "load_model_and_config": "inference"}


def __getattr__(name: str):  # torch loads with the module that needs it, not with `import vit.eval`
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
