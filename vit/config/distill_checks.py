"""The distillation settings' checks (vit/train/distill.py; the config's `distill:` section) and timm's rule for the
two loss weights, torch-free so that a bad setting fails in one sentence before any model is built.

Weights, as timm 1.0.31's distillation tasks resolve them (loss = task_weight * task + distill_weight * kd):
    distill_weight set          independent: (task_weight, or 1, distill_weight)
    only task_weight set        complementary: (task_weight, 1 - task_weight), so task_weight must lie in [0, 1]
    neither                     (1, 1)
Each weight is a finite number >= 0 and they are not both 0 (nothing would train).
"""

from __future__ import annotations

import math
from typing import Any

from .errors import ConfigError

KINDS = ("logit", "feature", "token")  # timm's LogitDistillationTask, FeatureDistillationTask, TokenDistillationTask
TOKEN_MODES = ("soft", "hard")  # token: KL at a temperature, or cross-entropy with the teacher's argmax (DeiT)
FEATURE_LOSSES = ("mse", "cosine")  # feature: mean squared error (timm's) or 1 - cosine similarity
FEATURES = ("pooled", "patch")  # feature: the pre-logits vector (timm's) or every patch token

__all__ = ["KINDS", "TOKEN_MODES", "FEATURE_LOSSES", "FEATURES", "distill_weights", "check_distill_settings"]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def distill_weights(task_weight: float | None, distill_weight: float | None) -> tuple[float, float]:
    """(task weight, distillation weight) by timm's three modes (module docstring); ConfigError when a weight is not
    a finite number >= 0, the complementary task_weight is above 1, or both are 0."""
    for key, value in (("task_weight", task_weight), ("distill_weight", distill_weight)):
        if value is not None and (not _number(value) or value < 0):
            raise ConfigError(f"config key 'distill.{key}' must be a finite number >= 0 (or null), got {value!r}.")
    if distill_weight is not None:
        weights = (1.0 if task_weight is None else float(task_weight), float(distill_weight))
    elif task_weight is not None:
        if task_weight > 1:
            raise ConfigError(f"config key 'distill.task_weight' is {task_weight!r} with distill.distill_weight null, "
                              "the complementary mode (distillation weighs 1 - task_weight), so it must lie in [0, 1]; "
                              "lower it or set distill.distill_weight too.")
        weights = (float(task_weight), 1.0 - task_weight)
    else:
        weights = (1.0, 1.0)
    if weights == (0.0, 0.0):
        raise ConfigError("config keys 'distill.task_weight' and 'distill.distill_weight' are both 0, so the loss is "
                          "0 and nothing trains; give one of them a positive weight.")
    return weights


def check_distill_settings(kind: str, temperature: float, task_weight: float | None, distill_weight: float | None,
                           token_mode: str, feature_loss: str, features: str) -> None:
    """ConfigError, one sentence naming the `distill.` key, for a setting no model needs to judge."""
    for key, value, choices in (("kind", kind, KINDS), ("token_mode", token_mode, TOKEN_MODES),
                                ("feature_loss", feature_loss, FEATURE_LOSSES), ("features", features, FEATURES)):
        if value not in choices:
            raise ConfigError(f"config key 'distill.{key}' must be one of {', '.join(choices)}, got {value!r}.")
    if not _number(temperature) or temperature <= 0:
        raise ConfigError(f"config key 'distill.temperature' divides the logits before the softmax and must be a "
                          f"finite number > 0 (1-4 is usual), got {temperature!r}.")
    distill_weights(task_weight, distill_weight)
