"""The distillation settings' checks (vit/train/distill.py; the config's `distill:` section) and timm's rule for the
two loss weights, torch-free so that a bad setting fails in one sentence before any model is built.

Weights, as timm 1.0.31's distillation tasks resolve them (loss = task_weight * task + distill_weight * kd):
    distill_weight set          independent: (task_weight, or 1, distill_weight)
    only task_weight set        complementary: (task_weight, 1 - task_weight), so task_weight must lie in [0, 1]
    neither                     (1, 1)
Each weight is a finite number >= 0 and they are not both 0 (nothing would train).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Literal

from .errors import ConfigError
from .schema import Config, DistillConfig

# the choices of each setting: the Literal types of DistillConfig's fields (their meanings are there)
CHOICES = {f.name: typing.get_args(t) for f in dataclasses.fields(DistillConfig)
           if typing.get_origin(t := typing.get_type_hints(DistillConfig)[f.name]) is Literal}

__all__ = ["CHOICES", "distill_weights", "check_distill_settings", "validate_distill"]


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
    if weights[1] == 0.0:
        how = "distill.distill_weight is 0" if distill_weight is not None else \
            "distill.task_weight 1 alone leaves distillation 1 - 1 = 0 (the complementary mode)"
        raise ConfigError(f"config key 'distill.{'distill_weight' if distill_weight is not None else 'task_weight'}'"
                          f": {how}, so the teacher teaches nothing; give distillation a positive weight or remove "
                          "distill.teacher.")
    return weights


def check_distill_settings(kind: str, temperature: float, task_weight: float | None, distill_weight: float | None,
                           token_mode: str, feature_loss: str, features: str) -> None:
    """ConfigError, one sentence naming the `distill.` key, for a setting no model needs to judge."""
    given = dict(kind=kind, token_mode=token_mode, feature_loss=feature_loss, features=features)
    for key, choices in CHOICES.items():
        if given[key] not in choices:
            raise ConfigError(f"config key 'distill.{key}' must be one of {', '.join(choices)}, got {given[key]!r}.")
    if not _number(temperature) or temperature <= 0:
        raise ConfigError(f"config key 'distill.temperature' divides the logits before the softmax and must be a "
                          f"finite number > 0 (1-4 is usual), got {temperature!r}.")
    distill_weights(task_weight, distill_weight)


def validate_distill(cfg: Config) -> None:
    """The `distill:` section against the rest of the config (vit/config/checks.py:validate calls it): its keys
    read only with a teacher, its settings, and the runs it cannot join; each refusal one sentence."""
    d, default = cfg.distill, DistillConfig()
    if d.teacher is None:
        changed = [f.name for f in dataclasses.fields(d) if getattr(d, f.name) != getattr(default, f.name)]
        if changed:
            raise ConfigError(f"config key 'distill.{changed[0]}' is read only with distill.teacher set; name the "
                              "teacher (a timm tag, hf-hub:, local-dir:, a run's best/) or remove the key.")
        return
    if not d.teacher.strip():
        raise ConfigError("config key 'distill.teacher' is empty; name the teacher (a timm tag, hf-hub:org/repo, "
                          "local-dir:/folder, a run's best/) or set it to null.")
    check_distill_settings(d.kind, d.temperature, d.task_weight, d.distill_weight, d.token_mode, d.feature_loss,
                           d.features)
    soft = d.kind == "logit" or (d.kind == "token" and d.token_mode == "soft")
    readers = {"temperature": (soft, "logit kd and soft token kd"), "token_mode": (d.kind == "token", "token kd"),
               "feature_loss": (d.kind == "feature", "feature kd"), "features": (d.kind == "feature", "feature kd")}
    for key, (read, by) in readers.items():
        if not read and getattr(d, key) != getattr(default, key):
            raise ConfigError(f"config key 'distill.{key}' is read by {by} only, and this run distils with "
                              f"distill.kind={d.kind}" + (" (hard)" if d.kind == "token" and key == "temperature"
                                                          else "") + "; remove it or change the kind.")
    if cfg.data.dataset in ("captions", "text_csv"):
        what = "a CLIP model" if cfg.data.dataset == "captions" else "a text model"
        raise ConfigError(f"config key 'distill.teacher' distils an image classifier, and data.dataset="
                          f"{cfg.data.dataset} trains {what}; remove distill.teacher or train on labelled images.")
    if cfg.data.labels_file and d.kind != "feature":
        raise ConfigError(f"config key 'distill.kind' is {d.kind}, a softmax over one class set (as timm's), and "
                          "data.labels_file makes this a multi-label run with sigmoid targets; use "
                          "distill.kind=feature, which does not read the targets.")
    if cfg.data.naflex is not None and (d.kind == "token" or (d.kind == "feature" and d.features == "patch")):
        key, value = ("kind", "token") if d.kind == "token" else ("features", "patch")
        raise ConfigError(f"config key 'distill.{key}' is {value}, and data.naflex gives each image its own patch "
                          "grid (a NaFlex model has no distillation token, and padded patch tokens have no teacher "
                          "token to match); use distill.kind=logit, or feature with distill.features=pooled.")
