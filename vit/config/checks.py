"""Range checks: the string-keyed tables of choices and ranges, and the checks a type cannot express within the
config (`check_sections`); combinations.py's `validate`, run by `from_dict` on every whole Config, adds the
checks between a run's sections."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal

from .errors import ConfigError
from .schema import (
    INTERPOLATIONS,
    Config,
    ContrastiveConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    SegConfig,
    check_preprocessing,
)


def _literal_choices(cls: type, prefix: str) -> dict[str, tuple]:
    """{'section.key': choices} for the fields of `cls` typed Literal[...] or Literal[...] | None (the choices live
    in the field's type; vit/config/choices.py holds the model's)."""
    out = {}
    for name, tp in typing.get_type_hints(cls).items():
        args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
        literals = [a for a in args if typing.get_origin(a) is Literal]
        if len(literals) == 1 and all(a is type(None) or a in literals for a in args):
            out[f"{prefix}.{name}"] = typing.get_args(literals[0]) + ((None,) if type(None) in args else ())
    return out


CHOICES = {
    **_literal_choices(ModelConfig, "model"),
    **_literal_choices(DataConfig, "data"),
    **_literal_choices(OptimConfig, "optim"),
    "optim.class_weights": ("auto", None),
    "data.dataset": ("digits", "imagefolder", "cifar10", "cifar100", "synthetic", "wds", "hf",
                     "text_csv", "captions", "segmentation"),
    "data.on_bad_image": ("skip", "error"),
    "aug.interpolation": (*INTERPOLATIONS, None),
    "run.mixed_precision": ("no", "bf16", "fp16", "auto", None),
    "run.on_nonfinite": ("stop", "skip"),
    **_literal_choices(RunConfig, "run"),
    **_literal_choices(ContrastiveConfig, "contrastive"),
    **_literal_choices(SegConfig, "seg"),
}
POSITIVE = {"model.img_size", "model.patch_size", "model.in_chans", "model.embed_dim", "model.depth",
            "model.num_heads", "model.mlp_ratio", "model.norm_eps", "model.attn_pool_num_heads",
            "model.attn_pool_mlp_ratio", "data.batch_size", "data.eval_batch_size", "run.epochs",
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
        "model.pos_drop_rate", "model.attn_drop_rate", "model.drop_path_rate", "aug.label_smoothing",
        "optim.layer_decay", "optim.ema_decay"}
# the model option that create_model takes and ModelConfig does not hold (the data's class count; a weights'
# config.json has it)
ARG_POSITIVE, ARG_NON_NEGATIVE, ARG_UNIT = set(), {"num_classes"}, set()
# LayerScale starts each residual branch at gamma = init_values (1e-6 to 1 in the published models); a gamma far
# above 1 multiplies every block's output (1e30 overflows float32 within two blocks: NaN logits)
INIT_VALUES_MAX = 10.0
# LayerNorm divides by sqrt(var + eps): published models use 1e-12 to 1e-5; an eps far above a token's variance
# (1e30) normalises every token to its bias, so every image gives the same output
NORM_EPS_MAX = 0.1


def check_sections(cfg: Config) -> None:
    """Range checks within each section that a type cannot express; each names its key."""
    flat = {f"{s}.{k}": v for s, sec in dataclasses.asdict(cfg).items() for k, v in sec.items()}
    for key, choices in CHOICES.items():
        if flat[key] not in choices:
            shown = ", ".join(repr(c) for c in choices if c is not None)
            raise ConfigError(f"config key '{key}' must be one of {shown}, got {flat[key]!r}.")
    for key in AUTO:  # a count or the word auto (resolved from the machine by vit.cli.runtime)
        if isinstance(flat[key], str) and flat[key] != "auto":
            raise ConfigError(f"config key '{key}' must be a number or 'auto', got {flat[key]!r}.")
    check_ranges(flat, POSITIVE, NON_NEGATIVE, UNIT)
    _validate_model(cfg.model)
    _validate_lists(cfg)
    _validate_run(cfg)
    a, m = cfg.aug, cfg.model
    # in_chans null follows the data, or aug.mean/std where they are set (1 or 3 values pin the channels)
    given = len(a.mean or a.std or [None] * 3)
    check_preprocessing(dict(mean=a.mean, std=a.std, crop_pct=a.eval_crop_pct),
                        m.in_chans or (given if given in (1, 3) else 3),
                        lambda k: f"config key 'aug.{'eval_crop_pct' if k == 'crop_pct' else k}'",
                        lambda k: " (model.in_chans)" if k in ("mean", "std") else "")


def _validate_model(m: ModelConfig) -> None:
    """The model keys' relations: patches tile the image, heads split the width, channels the data gives."""
    if m.patch_size and m.img_size % m.patch_size:
        raise ConfigError(
            f"config key 'model.patch_size' ({m.patch_size}) must divide 'model.img_size' ({m.img_size})."
        )
    if m.embed_dim and m.num_heads and m.embed_dim % m.num_heads:
        raise ConfigError(
            f"config key 'model.num_heads' ({m.num_heads}) must divide 'model.embed_dim' ({m.embed_dim})."
        )
    check_mlp_width(m.embed_dim, {"mlp_ratio": m.mlp_ratio, "attn_pool_mlp_ratio": m.attn_pool_mlp_ratio}, "model")
    if m.in_chans not in (1, 3, None):
        raise ConfigError(f"config key 'model.in_chans' must be 3 (RGB) or 1 (grey): the data pipelines give one of "
                          f"those, got {m.in_chans}.")


def check_mlp_width(dim: Any, ratios: dict[str, Any], section: str) -> None:
    """An MLP's hidden width is int(dim * ratio): a ratio that makes it 0 builds a block whose MLP adds nothing."""
    for key, ratio in ratios.items():
        if isinstance(dim, int) and isinstance(ratio, (int, float)) and 0 < ratio and dim * ratio < 1:
            raise ConfigError(f"config key '{section}.{key}' ({ratio!r}) gives an MLP of width int({dim} * "
                              f"{ratio!r}) = 0; give a ratio of at least 1/{dim}.")


def _validate_run(cfg: Config) -> None:
    """The run section: its folder name, trackers, how the best is picked, resume or overwrite."""
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


def check_ranges(flat: dict[str, Any], positive: set, non_negative: set, unit: set) -> None:
    """Range checks on {'dotted.key': value}: each number finite (inf or nan passes every comparison, and trains
    to NaN weights), and in range for the keys in `positive`, `non_negative`, `unit` ([0, 1]); init_values within
    [0, INIT_VALUES_MAX], norm_eps at most NORM_EPS_MAX."""
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
    for key in {k for k in flat if k.rsplit(".", 1)[-1] == "norm_eps"}:
        if isinstance(flat[key], (int, float)) and flat[key] > NORM_EPS_MAX:
            raise ConfigError(f"config key '{key}' (LayerNorm's epsilon, 1e-12 to 1e-5 in published models) must be "
                              f"at most {NORM_EPS_MAX:g}: one far above a token's variance makes every image's output "
                              f"the same, got {flat[key]!r}.")
    for key in {k for k in flat if k.rsplit(".", 1)[-1] == "init_values"}:
        if isinstance(flat[key], (int, float)) and not 0 <= flat[key] <= INIT_VALUES_MAX:
            raise ConfigError(f"config key '{key}' (the LayerScale start, 1e-6 to 1 in published models) must be "
                              f"between 0 and {INIT_VALUES_MAX:g}, got {flat[key]!r}.")



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
