"""Typed, strict experiment configs: dataclasses loaded from YAML, with dotted command-line overrides.

    cfg = load_config("configs/default.yaml", ["--optim.lr=3e-4", "--run.epochs", "10"])

An unknown key, a value of the wrong type or an out-of-range value raises `ConfigError` with the key's dotted
name. Values given on the command line are parsed as YAML scalars (`3e-4`, `true`, `[0.5, 1.0]`, `null`).
The resolved config is printed at start and saved with every checkpoint (`to_dict` / `from_dict`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["Config", "ConfigError", "load_config", "from_dict", "to_dict", "apply_overrides"]


class ConfigError(ValueError):
    """A bad config: the message names the key and says what is wrong."""


@dataclass
class ModelConfig:
    name: str = "vit_tiny_patch16_224"  # a vit.create_model name; the fields below override it
    img_size: int = 224
    patch_size: int | None = None
    in_chans: int = 3
    global_pool: str = "token"
    embed_dim: int | None = None
    depth: int | None = None
    num_heads: int | None = None
    mlp_ratio: float | None = None
    pos_embed: str = "learn"
    norm_layer: str = "layernorm"
    mlp_layer: str = "gelu"
    norm_first: bool = True
    init_values: float | None = None
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    pretrained: str | None = None  # a timm checkpoint file to fine-tune from
    token_reduction: str | None = None  # merge:8 (ToMe) or topk:0.7@3,6,9 (EViT); vit/layers/token_reduction.py


@dataclass
class DataConfig:
    dataset: str = "digits"  # digits | imagefolder | cifar10 | cifar100 | synthetic
    root: str | None = None  # imagefolder: folder with train/ and val/; cifar: download folder
    download: bool = True  # cifar only
    val_fraction: float = 0.2  # digits: stratified held-out share
    split_seed: int = 0
    batch_size: int = 64  # per process
    eval_batch_size: int | None = None
    num_workers: int = 0
    on_bad_image: str = "skip"  # skip | error
    synthetic_train_size: int = 512
    synthetic_val_size: int = 128
    synthetic_num_classes: int = 4


@dataclass
class AugConfig:
    random_resized_crop: bool = True
    scale: list[float] = field(default_factory=lambda: [0.08, 1.0])
    ratio: list[float] = field(default_factory=lambda: [0.75, 1.3333])
    affine_translate: float = 0.0  # fraction of the image size
    affine_rotate: float = 0.0  # degrees
    affine_scale: float = 0.0  # +- fraction
    hflip: float = 0.5
    color_jitter: float = 0.0
    rand_augment_ops: int = 0  # >0: apply that many random photometric/geometric ops (RandAugment-like)
    random_erasing: float = 0.0
    mixup: float = 0.0
    cutmix: float = 0.0
    mixup_prob: float = 1.0
    label_smoothing: float = 0.1
    mean: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    std: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    eval_crop_pct: float = 1.0
    interpolation: str = "bilinear"  # bilinear | bicubic, for resizing and crops


@dataclass
class OptimConfig:
    lr: float = 1e-3  # peak learning rate for the global batch
    min_lr: float = 1e-6
    weight_decay: float = 0.05
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_epochs: float = 5.0
    layer_decay: float | None = None  # e.g. 0.65 for fine-tuning
    clip_grad: float | None = 1.0
    grad_accum_steps: int = 1
    ema: bool = False
    ema_decay: float = 0.9998


@dataclass
class RunConfig:
    name: str = "default"
    output_dir: str = "runs"
    epochs: int = 100
    seed: int = 0
    mixed_precision: str | None = None  # no | bf16 | fp16; None: what `accelerate launch` was told
    compile: bool = False
    eval_every: int = 1  # epochs
    save_state_every: int = 0  # steps; 0 = at the end of every epoch
    keep_best: int = 1
    resume: str | None = None  # 'auto' or a state folder
    log_every: int = 10  # steps between TensorBoard points
    on_nonfinite: str = "stop"  # stop | skip
    max_steps: int | None = None  # stop early (smoke runs)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    aug: AugConfig = field(default_factory=AugConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)


CHOICES = {
    "model.global_pool": ("token", "avg"),
    "model.pos_embed": ("learn", "sincos"),
    "model.norm_layer": ("layernorm", "rmsnorm"),
    "model.mlp_layer": ("gelu", "swiglu"),
    "data.dataset": ("digits", "imagefolder", "cifar10", "cifar100", "synthetic"),
    "data.on_bad_image": ("skip", "error"),
    "aug.interpolation": ("bilinear", "bicubic"),
    "run.mixed_precision": ("no", "bf16", "fp16", None),
    "run.on_nonfinite": ("stop", "skip"),
}
POSITIVE = {"model.img_size", "model.patch_size", "model.in_chans", "model.embed_dim", "model.depth",
            "model.num_heads", "model.mlp_ratio", "data.batch_size", "data.eval_batch_size", "run.epochs",
            "optim.grad_accum_steps", "run.eval_every", "run.keep_best", "run.log_every", "run.max_steps",
            "data.synthetic_train_size", "data.synthetic_val_size", "data.synthetic_num_classes"}
NON_NEGATIVE = {"optim.lr", "optim.min_lr", "optim.weight_decay", "optim.warmup_epochs", "optim.clip_grad",
                "data.num_workers", "model.drop_rate", "model.attn_drop_rate", "model.drop_path_rate",
                "aug.mixup", "aug.cutmix", "aug.label_smoothing", "aug.color_jitter", "run.save_state_every",
                "aug.affine_translate", "aug.affine_rotate", "aug.affine_scale", "aug.rand_augment_ops"}
UNIT = {"data.val_fraction", "aug.hflip", "aug.random_erasing", "aug.mixup_prob", "model.drop_rate",
        "model.attn_drop_rate", "model.drop_path_rate", "aug.label_smoothing", "optim.layer_decay",
        "optim.ema_decay", "aug.eval_crop_pct"}


def _check_type(key: str, value: Any, tp: Any) -> Any:
    """Return `value` as type `tp`, or raise ConfigError naming `key`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _check_type(key, value, a)
            except ConfigError as e:
                errors.append(e)
        raise errors[0]
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise ConfigError(f"config key '{key}' must be a list, got {value!r}.")
        return [_check_type(f"{key}[{i}]", v, item) for i, v in enumerate(value)]
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):  # YAML 1.1 reads '3e-4' (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if tp in (int, float, str, bool) and (type(value) is not tp):
        raise ConfigError(
            f"config key '{key}' must be {tp.__name__}, got {type(value).__name__} {value!r}."
        )
    return value


def from_dict(data: dict | None, cls: type = Config, prefix: str = "") -> Any:
    """Build dataclass `cls` from a nested dict, strictly."""
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config section '{prefix or 'root'}' must be a mapping, got {data!r}.")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        key = f"{prefix}{unknown[0]}"
        raise ConfigError(f"unknown config key '{key}'; valid keys here: {', '.join(sorted(names))}.")
    kwargs = {}
    for name, value in data.items():
        key, tp = f"{prefix}{name}", hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = from_dict(value, tp, key + ".")
        else:
            kwargs[name] = _check_type(key, value, tp)
    obj = cls(**kwargs)
    if cls is Config:
        validate(obj)
    return obj


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def validate(cfg: Config) -> None:
    """Range checks that a type cannot express; each names its key."""
    flat = {f"{s}.{k}": v for s, sec in to_dict(cfg).items() for k, v in sec.items()}
    for key, choices in CHOICES.items():
        if flat[key] not in choices:
            shown = ", ".join(repr(c) for c in choices if c is not None)
            raise ConfigError(f"config key '{key}' must be one of {shown}, got {flat[key]!r}.")
    for key in POSITIVE:
        if flat[key] is not None and flat[key] <= 0:
            raise ConfigError(f"config key '{key}' must be positive, got {flat[key]!r}.")
    for key in NON_NEGATIVE:
        if flat[key] is not None and flat[key] < 0:
            raise ConfigError(f"config key '{key}' must not be negative, got {flat[key]!r}.")
    for key in UNIT:
        if flat[key] is not None and not 0 <= flat[key] <= 1:
            raise ConfigError(f"config key '{key}' must be between 0 and 1, got {flat[key]!r}.")
    m = cfg.model
    if m.patch_size and m.img_size % m.patch_size:
        raise ConfigError(
            f"config key 'model.patch_size' ({m.patch_size}) must divide 'model.img_size' ({m.img_size})."
        )
    if m.embed_dim and m.num_heads and m.embed_dim % m.num_heads:
        raise ConfigError(
            f"config key 'model.num_heads' ({m.num_heads}) must divide 'model.embed_dim' ({m.embed_dim})."
        )
    if cfg.data.dataset == "imagefolder" and not cfg.data.root:
        raise ConfigError("config key 'data.root' must name the ImageFolder (with train/ and val/) to use.")
    if len(cfg.aug.mean) != m.in_chans or len(cfg.aug.std) != m.in_chans:
        raise ConfigError(f"config keys 'aug.mean' and 'aug.std' need {m.in_chans} values (model.in_chans).")


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """['--optim.lr=3e-4', '--run.epochs', '5'] -> {'optim.lr': 0.0003, 'run.epochs': 5}."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or arg == "--":
            raise ConfigError(f"unexpected argument {arg!r}; overrides look like --section.key=value.")
        key = arg[2:]
        if "=" in key:
            key, raw = key.split("=", 1)
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            i += 1
            raw = args[i]
        else:
            raw = "true"  # a bare flag: --run.compile
        try:
            out[key] = yaml.safe_load(raw)
        except yaml.YAMLError:
            out[key] = raw
        i += 1
    return out


def apply_overrides(data: dict, overrides: dict[str, Any]) -> dict:
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        if len(parts) != 2:
            raise ConfigError(f"override '--{dotted}' must look like --section.key (e.g. --optim.lr=3e-4).")
        section, key = parts
        if section not in {f.name for f in dataclasses.fields(Config)}:
            raise ConfigError(
                f"unknown config key '{dotted}'; sections are: {', '.join(f.name for f in dataclasses.fields(Config))}."
            )
        data.setdefault(section, {})
        if not isinstance(data[section], dict):
            raise ConfigError(f"config section '{section}' must be a mapping.")
        data[section][key] = value
    return data


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist; pass --config with a path under configs/.")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"config file '{path}' is not valid YAML: {str(e).splitlines()[0]}.") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of sections, got {type(data).__name__}.")
    return data or {}


def load_config(path: str | Path | None, overrides: list[str] | dict[str, Any] | None = None) -> Config:
    data = read_yaml(path) if path else {}
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    return from_dict(apply_overrides(data, overrides or {}))


def dump(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
