"""The `pretrain:` section's checks (self-supervised pretraining: vit/train/tasks/pretrain.py), torch-free, so that a
bad setting is one sentence before any image is read or model built: an unknown method, crops the image cannot
give, a mask ratio that hides nothing or everything, temperatures and momenta out of range, keys of the other
method, and the supervised settings a run without labels cannot use."""

from __future__ import annotations

import dataclasses
import math

from .errors import ConfigError
from .schema import Config, PretrainConfig

__all__ = ["METHODS", "validate_pretrain"]

METHODS = ("dino", "mae")
# the keys each method reads (the rest of the section belongs to the other one)
MAE_KEYS = {"mask_ratio", "decoder_dim", "decoder_depth", "decoder_heads", "norm_pix_loss"}
BOTH_KEYS = {"method", "knn_root"}
DINO_KEYS = {f.name for f in dataclasses.fields(PretrainConfig)} - MAE_KEYS - BOTH_KEYS | {"mask_ratio"}


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _in(key: str, value, low: float, high: float, closed: str = "()", what: str = "") -> None:
    """ConfigError unless low < value < high (closed '[]': the ends allowed)."""
    lo_ok = value >= low if closed[0] == "[" else value > low
    hi_ok = value <= high if closed[1] == "]" else value < high
    if not _number(value) or not (lo_ok and hi_ok):
        raise ConfigError(f"config key 'pretrain.{key}' must lie in {closed[0]}{low}, {high}{closed[1]}{what}, "
                          f"got {value!r}.")


def _check_dino(p: PretrainConfig, img_size: int, patch: int | None) -> None:
    if p.local_crops < 0:
        raise ConfigError(f"config key 'pretrain.local_crops' counts crops and must be >= 0, got {p.local_crops!r}.")
    if p.local_crops and p.local_size > img_size:
        raise ConfigError(f"config key 'pretrain.local_size' is {p.local_size} pixels, larger than the "
                          f"{img_size}-pixel image (model.img_size) the crops are cut from; choose a local size "
                          "below it (DINO: about 3/7 of it).")
    if p.local_crops and patch and (p.local_size < patch or p.local_size % patch):
        raise ConfigError(f"config key 'pretrain.local_size' is {p.local_size} pixels, which is not a whole number "
                          f"of the model's {patch}-pixel patches; use a multiple of {patch}.")
    _in("global_scale", p.global_scale, 0.05, 1.0, "(]", " (the smallest share of the image a global crop covers)")
    for key in ("out_dim", "hidden_dim", "bottleneck_dim"):
        if not isinstance(getattr(p, key), int) or getattr(p, key) < 1:
            raise ConfigError(f"config key 'pretrain.{key}' is a width and must be >= 1, got {getattr(p, key)!r}.")
    for key in ("student_temp", "teacher_temp", "warmup_teacher_temp"):
        _in(key, getattr(p, key), 0.0, math.inf, what=" (a softmax temperature: DINO uses 0.04-0.1)")
    _in("warmup_teacher_temp_epochs", p.warmup_teacher_temp_epochs, 0.0, math.inf, "[)")
    _in("centre_momentum", p.centre_momentum, 0.0, 1.0, "[)")
    _in("momentum", p.momentum, 0.0, 1.0, "[]", " (the teacher's EMA momentum: DINO uses 0.996)")
    for key in ("koleo_weight", "ibot_weight", "collapse_spread"):
        _in(key, getattr(p, key), 0.0, math.inf, "[)")
    if p.ibot_weight:
        _in("mask_ratio", p.mask_ratio, 0.0, 1.0, what=" (the share of patches masked: 0 masks nothing, 1 all)")


def _check_mae(p: PretrainConfig) -> None:
    _in("mask_ratio", p.mask_ratio, 0.0, 1.0, what=" (the share of patches hidden: 0 hides nothing, 1 everything; "
        "MAE uses 0.75)")
    for key in ("decoder_dim", "decoder_depth", "decoder_heads"):
        if not isinstance(getattr(p, key), int) or getattr(p, key) < 1:
            raise ConfigError(f"config key 'pretrain.{key}' must be an integer >= 1, got {getattr(p, key)!r}.")
    if p.decoder_dim % p.decoder_heads:
        raise ConfigError(f"config key 'pretrain.decoder_heads' ({p.decoder_heads}) must divide "
                          f"pretrain.decoder_dim ({p.decoder_dim}).")


def validate_pretrain(cfg: Config) -> None:
    """The `pretrain:` section against the rest of the config (vit/config/combinations.py:validate calls it)."""
    p, default = cfg.pretrain, PretrainConfig()
    changed = [f.name for f in dataclasses.fields(p) if getattr(p, f.name) != getattr(default, f.name)]
    if p.method is None:
        if changed:
            raise ConfigError(f"config key 'pretrain.{changed[0]}' is read only with pretrain.method set; set it to "
                              "dino or mae, or remove the key.")
        return
    if p.method not in METHODS:
        raise ConfigError(f"config key 'pretrain.method' must be one of {', '.join(METHODS)} (or null), got "
                          f"{p.method!r}.")
    own = DINO_KEYS if p.method == "dino" else MAE_KEYS
    other = [k for k in changed if k not in BOTH_KEYS and k not in own]
    if other:
        raise ConfigError(f"config key 'pretrain.{other[0]}' is not read by pretrain.method={p.method}; remove it "
                          f"or choose the method that reads it.")
    if cfg.data.dataset not in ("imagefolder", "digits"):
        raise ConfigError(f"config key 'pretrain.method' pretrains on unlabelled images, read from a folder "
                          f"(data.dataset: imagefolder, data.root) or the digits, not data.dataset="
                          f"{cfg.data.dataset}; point data.root at a folder of images.")
    for key, why in (("labels_file", "labels"), ("naflex", "NaFlex batches")):
        if getattr(cfg.data, key):
            raise ConfigError(f"config key 'data.{key}' gives {why}, and pretrain.method trains without them; "
                              "remove it.")
    if cfg.distill.teacher is not None:
        raise ConfigError("config keys 'pretrain.method' and 'distill.teacher' both choose what the run learns from; "
                          "set one of them.")
    if p.knn_root is not None and not (isinstance(p.knn_root, str) and p.knn_root.strip()):
        raise ConfigError(f"config key 'pretrain.knn_root' names a folder of a few labelled images (train/ and val/ "
                          f"class folders), got {p.knn_root!r}; name one or set it to null.")
    if p.method == "dino":
        _check_dino(p, cfg.model.img_size, cfg.model.patch_size)
    else:
        _check_mae(p)
