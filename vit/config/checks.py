"""Strict loading and range checks: a nested dict to the typed `Config` (unknown keys and wrong types refused,
by dotted key), the string-keyed tables of choices and ranges, and the checks a type cannot express."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal

from .errors import ConfigError, OptionError
from .options import nest_sparse_keys
from .schema import (
    INTERPOLATIONS,
    Config,
    ContrastiveConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    check_preprocessing,
)


def _literal_choices(cls: type, prefix: str) -> dict[str, tuple]:
    """{'section.key': choices} for the fields of `cls` typed Literal[...] (the choices live in the field)."""
    hints = typing.get_type_hints(cls)
    return {f"{prefix}.{f.name}": typing.get_args(hints[f.name]) for f in dataclasses.fields(cls)
            if typing.get_origin(hints[f.name]) is Literal}


CHOICES = {
    **_literal_choices(ModelConfig, "model"),
    **_literal_choices(DataConfig, "data"),
    **_literal_choices(OptimConfig, "optim"),
    "optim.class_weights": ("auto", None),
    "data.dataset": ("digits", "imagefolder", "cifar10", "cifar100", "synthetic", "wds", "hf",
                     "text_csv", "captions"),
    "data.on_bad_image": ("skip", "error"),
    "aug.interpolation": (*INTERPOLATIONS, None),
    "run.mixed_precision": ("no", "bf16", "fp16", "auto", None),
    "run.on_nonfinite": ("stop", "skip"),
    **_literal_choices(RunConfig, "run"),
    **_literal_choices(ContrastiveConfig, "contrastive"),
}
POSITIVE = {"model.img_size", "model.patch_size", "model.in_chans", "model.embed_dim", "model.depth",
            "model.num_heads", "model.mlp_ratio", "data.batch_size", "data.eval_batch_size", "run.epochs",
            "optim.grad_accum_steps", "run.eval_every", "run.keep_best", "run.keep_states", "run.log_every",
            "run.max_steps",
            "data.synthetic_train_size", "data.synthetic_val_size", "data.synthetic_num_classes",
            "data.shuffle_buffer", "data.num_classes", "run.num_threads", "contrastive.embed_dim",
            "contrastive.text_width", "contrastive.text_depth", "contrastive.text_heads", "contrastive.context_length"}
NON_NEGATIVE = {"optim.indexer_warmup_steps", "optim.lora_rank",
                "optim.lr", "optim.min_lr", "optim.weight_decay", "optim.warmup_epochs", "optim.clip_grad",
                "data.num_workers", "model.drop_rate", "model.attn_drop_rate", "model.drop_path_rate",
                "aug.mixup", "aug.cutmix", "aug.label_smoothing", "aug.color_jitter", "run.save_state_every",
                "aug.affine_translate", "aug.affine_rotate", "aug.affine_scale", "aug.rand_augment_ops"}
AUTO = {"data.num_workers", "run.num_threads"}
LOG_SCALE_RANGE = (-87.0, 88.72)  # contrastive.logit_scale: exp() is a normal, finite float32 within it
# run.log_with: csv is our metrics.csv; the others are Accelerate's trackers (accelerate.utils.LoggerType)
TRACKERS = ("tensorboard", "csv", "wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive", "swanlab", "trackio")
UNIT = {"data.val_fraction", "aug.hflip", "aug.random_erasing", "aug.mixup_prob", "model.drop_rate",
        "model.attn_drop_rate", "model.drop_path_rate", "aug.label_smoothing", "optim.layer_decay",
        "optim.ema_decay"}
# model options that create_model takes but ModelConfig does not hold (they come from a weights' config.json)
ARG_POSITIVE, ARG_NON_NEGATIVE, ARG_UNIT = {"norm_eps"}, {"num_classes"}, {"pos_drop_rate"}
# YAML 1.1's boolean words, which StrictLoader (vit/config/loader.py) reads as strings: a key typed bool takes
# them back in _check_type, so `--run.compile=yes` means true.
YAML11_BOOLS = {"yes": True, "y": True, "on": True, "true": True, "no": False, "n": False, "off": False,
                "false": False}


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
    if tp is bool and isinstance(value, str) and value.lower() in YAML11_BOOLS:  # yes/no/on/off, as YAML 1.1
        return YAML11_BOOLS[value.lower()]
    if tp in (int, float, str, bool) and (type(value) is not tp):
        raise ConfigError(
            f"config key '{key}' must be {tp.__name__}, got {type(value).__name__} {value!r}."
        )
    return value


def from_dict(data: dict | None, cls: type = Config, prefix: str = "") -> Any:
    """Build dataclass `cls` from a nested dict, strictly (unknown keys and wrong types raise ConfigError with
    the dotted key); a whole `Config` is also range-checked (`validate`)."""
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config section '{prefix or 'root'}' must be a mapping, got {data!r}.")
    if cls is ModelConfig:
        data = nest_sparse_keys(data, prefix)  # configs saved with the flat sparse_* keys
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    names = {f.name for f in fields}
    unknown = sorted(set(data) - names)
    if unknown:
        key = f"{prefix}{unknown[0]}"
        raise ConfigError(f"unknown config key '{key}'; valid keys here: {', '.join(sorted(names))}.")
    missing = [f.name for f in fields if f.name not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"config key '{prefix}{missing[0]}' is missing; set it (--{prefix}{missing[0]}=...) or "
                          f"leave '{prefix[:-1]}' out.")
    kwargs = {}
    for name, value in data.items():
        key, tp = f"{prefix}{name}", hints[name]
        options = _optional_dataclass(tp)
        if dataclasses.is_dataclass(tp):
            kwargs[name] = from_dict(value, tp, key + ".")
        elif options is not None:  # an options object or null (e.g. model.sparse_attention)
            if value is not None and not isinstance(value, (dict, options)):
                raise ConfigError(f"config key '{key}' must be a mapping of {options.__name__} fields or null, got "
                                  f"{value!r}.")
            kwargs[name] = from_dict(value, options, key + ".") if isinstance(value, dict) else value
        else:
            kwargs[name] = _check_type(key, value, tp)
    try:
        obj = cls(**kwargs)
    except OptionError as e:  # an options object's own check, named by its dotted key
        raise ConfigError(f"config key '{prefix}{e.key}' {e.problem}") from None
    if cls is Config:
        validate(obj)
    return obj


def _optional_dataclass(tp: Any) -> type | None:
    """The dataclass of a `SomeOptions | None` field, else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        classes = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
        return classes[0] if len(classes) == 1 and type(None) in typing.get_args(tp) else None
    return None


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def validate(cfg: Config) -> None:
    """Range checks that a type cannot express; each names its key."""
    flat = {f"{s}.{k}": v for s, sec in to_dict(cfg).items() for k, v in sec.items()}
    for key, choices in CHOICES.items():
        if flat[key] not in choices:
            shown = ", ".join(repr(c) for c in choices if c is not None)
            raise ConfigError(f"config key '{key}' must be one of {shown}, got {flat[key]!r}.")
    for key in AUTO:  # a count or the word auto (resolved from the machine by vit.cli.runtime)
        if isinstance(flat[key], str) and flat[key] != "auto":
            raise ConfigError(f"config key '{key}' must be a number or 'auto', got {flat[key]!r}.")
    _check_ranges(flat, POSITIVE, NON_NEGATIVE, UNIT)
    m = cfg.model
    if cfg.optim.indexer_warmup_steps and getattr(m.sparse_attention, "method", None) != "dsa":
        raise ConfigError("config key 'optim.indexer_warmup_steps' trains DSA's indexer; set "
                          "model.sparse_attention.method to dsa or the warm-up to 0.")
    if cfg.optim.lora_rank and m.freeze:
        raise ConfigError("config keys 'model.freeze' and 'optim.lora_rank' both choose what trains; set one of them.")
    _validate_lists(cfg)
    _validate_run_name(cfg.run.name)
    for name in cfg.run.log_with or []:
        if name not in TRACKERS:
            raise ConfigError(f"config key 'run.log_with' names an unknown tracker {name!r}; choose from "
                              f"{', '.join(TRACKERS)}.")
    multi_label, select_by = bool(cfg.data.labels_file), cfg.run.select_by
    if select_by is not None and (select_by == "map") != multi_label and select_by != "loss":
        raise ConfigError(f"config key 'run.select_by' is {select_by}, which " + (
            "multi-label data (data.labels_file) does not have; choose map or loss." if multi_label else
            "needs multi-label data (data.labels_file); choose top1, macro_f1, balanced_accuracy or loss."))
    if cfg.run.overwrite and cfg.run.resume:
        raise ConfigError("config keys 'run.overwrite' and 'run.resume' contradict each other; pass one of them.")
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
    if m.in_chans not in (1, 3, None):
        raise ConfigError(f"config key 'model.in_chans' must be 3 (RGB) or 1 (grey): the data pipelines give one of "
                          f"those, got {m.in_chans}.")
    _validate_data_use(cfg)
    _validate_contrastive(cfg)
    a = cfg.aug
    # in_chans null follows the data, or aug.mean/std where they are set (1 or 3 values pin the channels)
    given = len(a.mean or a.std or [None] * 3)
    check_preprocessing(dict(mean=a.mean, std=a.std, crop_pct=a.eval_crop_pct),
                        m.in_chans or (given if given in (1, 3) else 3),
                        lambda k: f"config key 'aug.{'eval_crop_pct' if k == 'crop_pct' else k}'",
                        lambda k: " (model.in_chans)" if k in ("mean", "std") else "")



def _validate_data_use(cfg: Config) -> None:
    """What a dataset can give: balancing needs single labels known up front, a labels file an ImageFolder,
    shards and Hugging Face data a root."""
    for key, on in (("data.sampler", cfg.data.sampler == "balanced"), ("optim.class_weights", cfg.optim.class_weights)):
        if on and cfg.data.labels_file:
            raise ConfigError(f"config key '{key}' balances single-label classes, and data.labels_file makes this a "
                              f"multi-label run; remove {key}.")
        if on and cfg.data.dataset == "wds":
            raise ConfigError(f"config key '{key}' needs every training label before the first step, which shards "
                              f"streamed in order (data.dataset=wds) do not give; remove {key}.")
    if cfg.data.labels_file and cfg.data.dataset != "imagefolder":
        raise ConfigError(f"config key 'data.labels_file' lists images under data.root and needs "
                          f"data.dataset=imagefolder, got {cfg.data.dataset!r}; set it, or remove data.labels_file.")
    if cfg.data.dataset == "text_csv" and not (cfg.data.root and isinstance(cfg.model.pretrained, str)):
        raise ConfigError("data.dataset=text_csv needs data.root (a CSV of text and labels) and model.pretrained (the "
                          "text model to fine-tune, e.g. hf-hub:google-bert/bert-base-uncased).")
    if cfg.data.naflex is not None:
        _validate_naflex(cfg)
    if cfg.data.dataset in ("wds", "hf") and not cfg.data.root:
        raise ConfigError(f"config key 'data.root' must name the {cfg.data.dataset} data to use (a shard folder "
                          "with _info.json, or a Hugging Face dataset saved on disk).")

def _validate_contrastive(cfg: Config) -> None:
    """A contrastive run (data.dataset=captions) has no class labels to mix, balance or pick checkpoints by, and
    its keys mean nothing to another dataset."""
    c, default = cfg.contrastive, ContrastiveConfig()
    if cfg.data.dataset != "captions":
        changed = [f.name for f in dataclasses.fields(c) if getattr(c, f.name) != getattr(default, f.name)]
        if changed:
            raise ConfigError(f"config key 'contrastive.{changed[0]}' is read only with data.dataset captions, and "
                              f"data.dataset is {cfg.data.dataset!r}; remove it or set data.dataset=captions.")
        return
    if not cfg.data.root:
        raise ConfigError("data.dataset=captions needs data.root: the folder of the images (with "
                          "contrastive.captions_file naming their captions, or class subfolders captioned by name).")
    refused = {"aug.mixup": cfg.aug.mixup > 0, "aug.cutmix": cfg.aug.cutmix > 0,
               "optim.class_weights": cfg.optim.class_weights is not None,
               "data.sampler": cfg.data.sampler != "shuffle",
               "data.labels_file": cfg.data.labels_file is not None, "optim.lora_rank": cfg.optim.lora_rank > 0,
               "model.freeze": cfg.model.freeze, "model.pretrained": cfg.model.pretrained not in (None, False)}
    for key, on in refused.items():
        if on:
            hint = " (contrastive.pretrained names a CLIP model to start from)" if key == "model.pretrained" else ""
            raise ConfigError(f"config key '{key}' has no meaning in a contrastive run (data.dataset=captions): "
                              f"captions are its labels; remove it{hint}.")
    if cfg.run.select_by not in (None, "top1", "loss"):
        raise ConfigError(f"config key 'run.select_by' is {cfg.run.select_by}, which a contrastive run does not "
                          "measure; choose top1 (image-to-caption retrieval on val) or loss.")
    if c.loss == "clip" and c.logit_bias is not None:
        raise ConfigError("config key 'contrastive.logit_bias' is SigLIP's; CLIP's softmax has no bias: remove it or "
                          "set contrastive.loss=siglip.")
    if c.logit_scale is not None and not LOG_SCALE_RANGE[0] <= c.logit_scale <= LOG_SCALE_RANGE[1]:
        raise ConfigError(f"config key 'contrastive.logit_scale' is the log of the similarity scale, whose exp is "
                          f"{'0' if c.logit_scale < 0 else 'infinite'} in float32 at {c.logit_scale:g}; use a value "
                          f"from {LOG_SCALE_RANGE[0]:g} to {LOG_SCALE_RANGE[1]:g} (CLIP starts at log(1 / 0.07) = "
                          "2.66, open_clip clamps it at log(100) = 4.61).")
    if c.loss == "clip" and c.exchange != "gather":
        raise ConfigError("config key 'contrastive.exchange=ring' passes SigLIP's caption chunks between processes; "
                          "CLIP's softmax needs every caption at once: set contrastive.loss=siglip or exchange=gather.")
    if c.text_width % c.text_heads:
        raise ConfigError(f"config key 'contrastive.text_heads' ({c.text_heads}) must divide "
                          f"'contrastive.text_width' ({c.text_width}).")
    if c.context_length < 3:
        raise ConfigError(f"config key 'contrastive.context_length' must be at least 3 (start, a word, end), got "
                          f"{c.context_length}.")
    if c.template.count("{}") != 1:
        raise ConfigError(f"config key 'contrastive.template' must hold one {{}} where the class name goes (e.g. 'a "
                          f"photo of a {{}}.'), got {c.template!r:.80}.")

NAFLEX_DATASETS = ("imagefolder", "digits", "cifar10", "cifar100", "synthetic")  # image sizes known before reading


def _validate_naflex(cfg: Config) -> None:
    """data.naflex batches images of many sizes by their patch counts, known before any image is decoded."""
    d, a = cfg.data, cfg.aug
    if d.dataset not in NAFLEX_DATASETS or d.labels_file:
        raise ConfigError(f"config key 'data.naflex' needs every image's size before the epoch starts, which "
                          f"data.dataset={d.dataset!r}" + (" with data.labels_file" if d.labels_file else "") +
                          f" does not give; use one of {', '.join(NAFLEX_DATASETS)} (single-label), or remove "
                          "data.naflex.")
    if a.mixup or a.cutmix:
        raise ConfigError("config keys 'aug.mixup' and 'aug.cutmix' mix images of one size, and data.naflex gives "
                          "each image its own; set both to 0 or remove data.naflex.")
    if d.sampler != "shuffle":
        raise ConfigError(f"config key 'data.sampler' is {d.sampler!r}, and data.naflex batches by patch budget with "
                          "its own shuffle; set data.sampler=shuffle (optim.class_weights=auto balances classes).")


# data.* keys that only some datasets read (data.dataset -> which); any other key applies to every dataset
DATASET_KEYS = {
    "root": ("imagefolder", "cifar10", "cifar100", "wds", "hf", "text_csv", "captions"),
    "download": ("cifar10", "cifar100"), "val_fraction": ("digits", "imagefolder", "text_csv", "captions"),
    "split_seed": ("digits", "imagefolder", "text_csv", "captions"),
    "synthetic_train_size": ("synthetic",), "synthetic_val_size": ("synthetic",),
    "synthetic_num_classes": ("synthetic",), "train_split": ("wds", "hf"), "val_split": ("wds", "hf"),
    "shuffle_buffer": ("wds",), "num_classes": ("wds", "hf"), "image_column": ("hf",),
    "label_column": ("hf", "text_csv"), "text_column": ("text_csv",),
    "labels_file": ("imagefolder",),
}


def check_dataset_keys(cfg: Config, keys: list[str] | None = None) -> None:
    """Refuse, in one sentence, a data.* key that the chosen data.dataset would ignore: among `keys` (dotted,
    e.g. a script's overrides), or else every data key whose value is not its default (so a recipe written for
    the digits, whose defaults it keeps, can still be pointed at a folder)."""
    default, d = DataConfig(), cfg.data
    if keys is None:
        keys = [f"data.{k}" for k in DATASET_KEYS if getattr(d, k) != getattr(default, k)]
    for dotted in keys:
        key = dotted.split(".", 1)[1] if dotted.startswith("data.") else None
        if key in DATASET_KEYS and d.dataset not in DATASET_KEYS[key] and getattr(d, key) is not None:
            hint = " (evaluate.py: --split NAME scores another split)" if key in ("train_split", "val_split") else ""
            raise ConfigError(f"config key 'data.{key}' is read only with data.dataset "
                              f"{' / '.join(DATASET_KEYS[key])}, and data.dataset is {d.dataset!r}, which would "
                              f"ignore it; remove it{hint}.")


def _check_ranges(flat: dict[str, Any], positive: set, non_negative: set, unit: set) -> None:
    """Range checks on {'dotted.key': value}: each number finite (inf or nan passes every comparison, and trains
    to NaN weights), and in range for the keys in `positive`, `non_negative`, `unit` ([0, 1])."""
    for key in positive & flat.keys():
        if isinstance(flat[key], (int, float)) and flat[key] <= 0:
            raise ConfigError(f"config key '{key}' must be positive, got {flat[key]!r}.")
    for key in non_negative & flat.keys():
        if isinstance(flat[key], (int, float)) and flat[key] < 0:
            raise ConfigError(f"config key '{key}' must not be negative, got {flat[key]!r}.")
    for key in unit & flat.keys():
        if isinstance(flat[key], (int, float)) and not 0 <= flat[key] <= 1:
            raise ConfigError(f"config key '{key}' must be between 0 and 1, got {flat[key]!r}.")
    for key, value in flat.items():
        for i, v in enumerate(value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(v, float) and not math.isfinite(v):
                where = f"{key}[{i}]" if isinstance(value, (list, tuple)) else key
                raise ConfigError(f"config key '{where}' must be a finite number, got {v!r}.")


def check_model_args(args: dict[str, Any], hints: dict[str, Any], where: str) -> None:
    """A model's construction arguments read from a file (a config.json's model_args, with the class count and
    channels of its pretrained_cfg), checked like the config's model keys before anything is built: the type of
    `hints` (the model's signature; `int | tuple[int, int]` takes an int or a pair), the ranges of the config's
    model.* keys, finite numbers, num_heads dividing embed_dim. Keys not in `hints` are left to create_model,
    which names them. Raises ConfigError: `where`, then 'model_args.<key>' and what is wrong."""
    flat = {}
    try:
        for key, value in args.items():
            if key not in hints:
                continue
            tp, dotted = hints[key], f"model_args.{key}"
            options = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
            pair = any(typing.get_origin(a) is tuple for a in options)
            if pair and isinstance(value, (list, tuple)):
                if len(value) != 2:
                    raise ConfigError(f"config key '{dotted}' must be an int or a pair of ints, got {value!r}.")
                flat[dotted] = [_check_type(f"{dotted}[{i}]", v, int) for i, v in enumerate(value)]
                continue
            literal = next((a for a in options if typing.get_origin(a) is Literal), None)
            if literal is not None:
                if value not in typing.get_args(literal):
                    shown = ", ".join(repr(c) for c in typing.get_args(literal))
                    raise ConfigError(f"config key '{dotted}' must be one of {shown}, got {value!r}.")
                flat[dotted] = value
                continue
            plain = [a for a in options if typing.get_origin(a) is not tuple]
            flat[dotted] = _check_type(dotted, value, typing.Union[tuple(plain)] if len(plain) > 1 else plain[0])  # noqa: UP007
        named = lambda keys, extra: {f"model_args.{k[6:]}" for k in keys if k.startswith("model.")} | {  # noqa: E731
            f"model_args.{k}" for k in extra}
        _check_ranges(flat, named(POSITIVE, ARG_POSITIVE), named(NON_NEGATIVE, ARG_NON_NEGATIVE),
                      named(UNIT, ARG_UNIT))
        dim, heads = flat.get("model_args.embed_dim"), flat.get("model_args.num_heads")
        if dim and heads and dim % heads:
            raise ConfigError(f"config key 'model_args.num_heads' ({heads}) must divide 'model_args.embed_dim' "
                              f"({dim}).")
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def _validate_lists(cfg: Config) -> None:
    a, o = cfg.aug, cfg.optim
    for key, pair, lo in (("aug.scale", a.scale, 0.0), ("aug.ratio", a.ratio, 0.0)):
        if len(pair) != 2 or not lo < pair[0] <= pair[1]:
            raise ConfigError(f"config key '{key}' must be [min, max] with 0 < min <= max, got {pair}.")
    if a.scale[1] > 1:
        raise ConfigError(f"config key 'aug.scale' must not exceed 1 (a share of the image area), got {a.scale}.")
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        raise ConfigError(f"config key 'optim.betas' must be two values in [0, 1), got {o.betas}.")


def _validate_run_name(name: str) -> None:
    """The run folder is output_dir/name: a name that is a path could write anywhere."""
    if not name or name.strip() != name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise ConfigError(f"config key 'run.name' must be a plain folder name (no '/', '..' or surrounding spaces, "
                          f"not empty), got {name!r}.")


def diff(old: Config, new: Config) -> dict[str, tuple[Any, Any]]:
    """{'section.key': (old value, new value)} for every key whose value differs."""
    a, b = to_dict(old), to_dict(new)
    return {f"{s}.{k}": (a[s][k], b[s][k]) for s in a for k in a[s] if a[s][k] != b[s][k]}
