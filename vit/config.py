"""Typed, strict experiment configs: dataclasses loaded from YAML, with dotted command-line overrides.

    cfg = load_config("configs/default.yaml", ["--optim.lr=3e-4", "--run.epochs", "10"])

An unknown key, a value of the wrong type or an out-of-range value raises `ConfigError` with the key's dotted
name. Values given on the command line are parsed as YAML scalars (`3e-4`, `true`, `[0.5, 1.0]`, `null`).
The resolved config is printed at start and saved with every checkpoint (`to_dict` / `from_dict`).
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

__all__ = ["Config", "ConfigError", "load_config", "from_dict", "to_dict", "apply_overrides", "read_yaml", "diff",
           "withhold_remote_sources", "check_data_sources", "is_remote_source",
           "check_model_args", "check_preprocessing", "check_dataset_keys"]


class ConfigError(ValueError):
    """A bad config: the message names the key and says what is wrong."""


DEFAULT_MODEL = "vit_tiny_patch16_224"  # model.name when neither it nor model.pretrained names an architecture


@dataclass
class ModelConfig:
    # Each field is a vit.create_model argument of the same name (vit/models/build.py passes the section straight
    # through): a new model option is one line here, its choices (if any) in a Literal type.
    # a vit.create_model name; the fields below override it. null: the architecture of the weights
    # model.pretrained names (so the two cannot disagree), else vit_tiny_patch16_224 (vit.models.build.resolve_name)
    name: str | None = None
    img_size: int = 224  # input height and width in pixels
    patch_size: int | None = None  # patch side in pixels; null: the name's (16 for *_patch16_*)
    # input channels, 3 (RGB) or 1 (grey); null: the data's (1 when its images are grey, else 3), see
    # vit.data.datasets.choose_channels; a number pins it
    in_chans: int | None = None
    # token: the [CLS] token feeds the head; avg: the mean of the patch tokens
    global_pool: Literal["token", "avg"] = "token"
    embed_dim: int | None = None  # token width D; null: the name's
    depth: int | None = None  # number of Transformer blocks; null: the name's
    num_heads: int | None = None  # attention heads per block (must divide embed_dim); null: the name's
    mlp_ratio: float | None = None  # MLP hidden width / embed_dim; null: the name's (4.0)
    # learn: learned position embedding (ViT); sincos: fixed 2-D sin-cos
    pos_embed: Literal["learn", "sincos"] = "learn"
    norm_layer: Literal["layernorm", "rmsnorm"] = "layernorm"  # normalisation in every block
    mlp_layer: Literal["gelu", "swiglu"] = "gelu"  # gelu: fc-GELU-fc (ViT); swiglu: gated SiLU MLP
    norm_first: bool = True  # pre-norm blocks (ViT); false: post-norm (original Transformer)
    init_values: float | None = None  # LayerScale initial value (e.g. 1e-5, CaiT/DeiT III); null: none
    drop_rate: float = 0.0  # dropout on the features before the head
    attn_drop_rate: float = 0.0  # dropout on the attention weights
    drop_path_rate: float = 0.0  # stochastic depth, rising linearly to this rate in the last block
    # weights to fine-tune from: true (those `name` points at, e.g. timm's default tag from the Hugging Face
    # cache), a hub name (vit_base_patch16_224.augreg_in21k, hf-hub:org/repo[@rev], local-dir:/folder), a folder
    # (a run's best/) or a weights file; see vit/hub/names.py
    pretrained: bool | str | None = None
    # e.g. merge:8 (ToMe) or topk:0.7@3,6,9 (EViT); see vit/layers/token_reduction.py
    token_reduction: str | None = None
    # top-k key blocks per query (vit/layers/sparse_attention.py): dsa (a learned indexer, DeepSeek-V3.2) or moba
    # (a parameter-free gate, MoBA); null: dense attention
    sparse_attention: Literal[None, "dsa", "moba"] = None
    sparse_block_size: int = 128  # tokens per key (and query) block
    sparse_topk_blocks: int | None = None  # key blocks kept per query, own block and sink included; or
    sparse_density: float | None = None  # the kept share of the blocks; both null: 0.125
    sparse_select: Literal[None, "token", "block"] = None  # per query token or per query block; null: the method's
    sparse_own_block: bool | None = None  # always keep the query's own block; null: the method's (yes)
    sparse_sink_block: bool | None = None  # always keep the first block ([CLS]); null: the method's (dsa yes, moba no)
    sparse_min_tokens: int | None = None  # dense below this many tokens; null: the measured crossover, 0: never
    grad_checkpointing: bool = False  # recompute each block in backward: same gradients, far less activation memory
    freeze: bool = False  # train the head only: the backbone keeps the weights it was loaded with (docs/few-labels.md)


@dataclass
class DataConfig:
    dataset: str = "digits"  # digits | imagefolder | cifar10 | cifar100 | synthetic | wds | hf
    # imagefolder: folder with train/ and val/ (no val/: val_fraction of train/); cifar: download folder;
    # wds: shard folder with _info.json, URL or 'pipe:' prefix (vit/data/shard_loader.py); hf: a
    # datasets.save_to_disk folder or a folder of parquet files (vit/data/hf_datasets.py)
    root: str | None = None
    download: bool = True  # cifar only
    val_fraction: float = 0.2  # digits, and an imagefolder without val/: stratified held-out share
    split_seed: int = 0  # seed of the held-out split
    batch_size: int = 64  # per process
    eval_batch_size: int | None = None  # per process; null: batch_size
    num_workers: int | str = "auto"  # loader processes per process (0: the main one); auto: from the CPUs, device
    on_bad_image: str = "skip"  # skip | error
    synthetic_train_size: int = 512  # synthetic only: training images
    synthetic_val_size: int = 128  # synthetic only: held-out images
    synthetic_num_classes: int = 4  # synthetic only: classes
    # wds and hf: split names (_info.json's, the dataset's) or, for wds, brace patterns 'train-{00000..00099}.tar'
    train_split: str = "train"  # wds and hf: the training split's name (wds: or a brace pattern)
    val_split: str = "val"  # wds and hf: the held-out split's name (wds: or a brace pattern)
    shuffle_buffer: int = 2048  # wds: samples shuffled together (held as raw bytes, per loader worker)
    num_classes: int | None = None  # wds/hf: when the data does not name its classes (labels 0..n-1)
    image_column: str = "image"  # hf: the column holding the images
    label_column: str = "label"  # hf: the column holding the integer labels
    # imagefolder, multi-label: a CSV (image,labels[,split]) or JSON ({image: [labels]}) file listing images under
    # data.root with any number of labels each (vit/data/multilabel.py); sigmoid + BCE, scored by mAP
    labels_file: str | None = None
    # shuffle: each image once per epoch; balanced: as many draws per epoch, each class equally likely (images
    # drawn with replacement, weight 1 / their class's count), seeded per (seed, epoch) so a resume is exact
    sampler: Literal["shuffle", "balanced"] = "shuffle"


INTERPOLATIONS = ("bilinear", "bicubic")
MIN_CROP_PCT = 0.1  # a smaller centre-crop share resizes images to over 10x the model's input before cropping


@dataclass
class AugConfig:
    random_resized_crop: bool = True  # train crops of a random area (scale) and aspect (ratio), resized
    scale: list[float] = field(default_factory=lambda: [0.08, 1.0])  # random_resized_crop: [min, max] image area share
    ratio: list[float] = field(default_factory=lambda: [0.75, 1.3333])  # random_resized_crop: [min, max] aspect ratio
    affine_translate: float = 0.0  # fraction of the image size
    affine_rotate: float = 0.0  # degrees
    affine_scale: float = 0.0  # +- fraction
    hflip: float = 0.5  # probability of a horizontal flip
    color_jitter: float = 0.0  # brightness/contrast/saturation jitter strength
    rand_augment_ops: int = 0  # >0: apply that many random photometric/geometric ops (RandAugment-like)
    random_erasing: float = 0.0  # probability of erasing a random rectangle
    mixup: float = 0.0  # mixup alpha (0: off)
    cutmix: float = 0.0  # cutmix alpha (0: off)
    mixup_prob: float = 1.0  # probability of mixing a batch when mixup or cutmix is on
    label_smoothing: float = 0.1  # share of the target spread over all classes
    # Preprocessing; None (unset): the pretrained weights' own (model.pretrained_cfg, as timm's
    # resolve_data_config), else the fallbacks in `resolved`. train.py saves the resolved values.
    mean: list[float] | None = None  # per-channel mean subtracted; null: the pretrained weights' own, else 0.5
    std: list[float] | None = None  # per-channel std divided by; null: the pretrained weights' own, else 0.5
    eval_crop_pct: float | None = None  # evaluation centre-crop share; null: the weights' crop_pct, else 1.0
    interpolation: str | None = None  # bilinear | bicubic, for resizing and crops

    def resolved(self, pretrained_cfg: dict | None = None, in_chans: int | None = 3) -> AugConfig:
        """A copy with mean, std, eval_crop_pct and interpolation filled where unset: from the weights'
        pretrained config (timm's keys mean, std, crop_pct, interpolation) where it has a usable value, else 0.5,
        0.5, 1.0 and bilinear. Values taken from the weights pass the config's own checks (`check_preprocessing`,
        one sentence if not); statistics for the weights' own channel count when the model has another (RGB
        weights adapted to a grey model) fall back. A ViT fine-tuned with other statistics than its weights saw loses
        accuracy silently, so values the config sets are kept and everything else follows the weights."""
        p, in_chans = pretrained_cfg or {}, in_chans or 3
        own = p.get("input_size")  # the weights' own channels: statistics for those are theirs, not malformed
        own = own[0] if isinstance(own, (list, tuple)) and own and isinstance(own[0], int) else in_chans
        unset = {"mean": self.mean, "std": self.std, "crop_pct": self.eval_crop_pct}
        check_preprocessing({k: p.get(k) for k, v in unset.items() if v is None}, own,
                            lambda k: f"the weights' pretrained config (config.json pretrained_cfg) '{k}'",
                            lambda k: f"; fix it there, or set --aug.{'eval_crop_pct' if k == 'crop_pct' else k}")

        def pick(value, key, fallback, usable):
            if value is not None:
                return value
            return p[key] if p.get(key) is not None and usable(p[key]) else fallback

        return dataclasses.replace(
            self,
            mean=[float(v) for v in pick(self.mean, "mean", [0.5] * in_chans, lambda v: len(v) == in_chans)],
            std=[float(v) for v in pick(self.std, "std", [0.5] * in_chans, lambda v: len(v) == in_chans)],
            eval_crop_pct=float(pick(self.eval_crop_pct, "crop_pct", 1.0, lambda v: True)),
            interpolation=pick(self.interpolation, "interpolation", "bilinear", lambda v: v in INTERPOLATIONS),
        )


def check_preprocessing(values: dict[str, Any], channels: int, name, advice=lambda key: "") -> None:
    """The checks every source of preprocessing passes (the config's aug.* keys, a weights' pretrained_cfg):
    `mean` and `std` lists of `channels` finite numbers, `std` positive (images are divided by it), `crop_pct`
    in [MIN_CROP_PCT, 1]; None: unset. Raises ConfigError: `name(key)` says where the value came from, and
    `advice(key)` is added before the full stop."""
    for key in ("mean", "std"):
        v = values.get(key)
        if v is None:
            continue
        if not isinstance(v, (list, tuple)) or not all(type(x) in (int, float) for x in v):
            raise ConfigError(f"{name(key)} must be a list of numbers, got {v!r}{advice(key)}.")
        if not all(math.isfinite(x) for x in v):
            raise ConfigError(f"{name(key)} must hold finite numbers, got {list(v)}{advice(key)}.")
        if len(v) != channels:
            raise ConfigError(f"{name(key)} needs {channels} values (one per input channel), got {list(v)}"
                              f"{advice(key)}.")
        if key == "std" and any(x <= 0 for x in v):
            raise ConfigError(f"{name(key)} must hold positive values (images are divided by it), got {list(v)}"
                              f"{advice(key)}.")
    crop = values.get("crop_pct")
    if crop is not None and (type(crop) not in (int, float) or not MIN_CROP_PCT <= crop <= 1):
        raise ConfigError(f"{name('crop_pct')} must be between {MIN_CROP_PCT} and 1 (the centre crop's share of the "
                          f"resized image), got {crop!r}{advice('crop_pct')}.")


@dataclass
class OptimConfig:
    lr: float = 1e-3  # peak learning rate for the global batch
    min_lr: float = 1e-6  # floor of the cosine schedule
    weight_decay: float = 0.05  # AdamW decoupled weight decay (not on norms, biases, tokens)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW betas
    warmup_epochs: float = 5.0  # linear warm-up from 0 to lr (fractions allowed)
    layer_decay: float | None = None  # e.g. 0.65 for fine-tuning
    clip_grad: float | None = 1.0  # clip the global gradient norm to this; null: no clipping
    grad_accum_steps: int = 1  # micro-batches per optimizer step
    ema: bool = False  # also keep an exponential moving average of the weights (timm ModelEmaV3); evaluated and saved
    ema_decay: float = 0.9998  # EMA decay per optimizer step
    # null: every class weighs the same in the loss; auto: inverse frequency in the training split,
    # n / (num_classes * n_c), so that each class contributes as much in total (cross-entropy's weight)
    class_weights: Literal["auto"] | None = None
    # model.sparse_attention=dsa: DeepSeek's indexer warm-up, optimizer steps where only the indexer learns the
    # dense attention (KL), the rest frozen; sparse training follows, the indexer still learning on its selection
    indexer_warmup_steps: int = 0
    # how the indexer's KL weighs query rows: mean (DeepSeek's, every row alike) or peaked (rows weighted by how
    # concentrated their dense attention is; better where few rows are read, e.g. a [CLS] classifier)
    indexer_kl_rows: Literal["mean", "peaked"] = "mean"
    # LoRA adapters of this rank on every block's qkv, proj, fc1 and fc2 (peft; vit/train/lora.py), the rest but
    # the head frozen; merged into the weights on save, so checkpoints hold a plain model. 0: none
    lora_rank: int = 0
    lora_alpha: float | None = None  # the LoRA update's scale is lora_alpha / lora_rank; null: lora_rank (scale 1)


@dataclass
class RunConfig:
    name: str = "default"  # the run folder is output_dir/name
    output_dir: str = "runs"  # parent folder of run folders
    epochs: int = 100  # training epochs
    seed: int = 0  # seed for weights, augmentation and data order
    # no | bf16 | fp16 | auto (bf16 on a GPU that has it, else no); None: what `accelerate launch` was told
    mixed_precision: str | None = None
    num_threads: int | str = "auto"  # torch threads per process; auto: its share of the CPUs minus the loader workers
    compile: bool = False  # torch.compile the model
    eval_every: int = 1  # epochs
    save_state_every: int = 0  # steps; 0 = at the end of every epoch
    keep_best: int = 1  # best checkpoints kept (by val_acc1)
    # resumable training states kept in state/ (each: weights + optimizer moments, ~3x the model); the oldest is
    # deleted once a newer one is complete. 2: a damaged newest state falls back to the one before; 1: half the disk
    keep_states: int = 2
    resume: str | None = None  # 'auto' or a state folder
    overwrite: bool = False  # start afresh in a run folder that already holds a run (its files are deleted)
    log_every: int = 10  # steps between the trackers' train-loss points
    # experiment trackers, through Accelerate: tensorboard, csv (metrics.csv, always written), wandb, mlflow,
    # comet_ml, aim, clearml, dvclive, swanlab, trackio; null: [tensorboard, csv] (see vit/train/tracking.py)
    log_with: list[str] | None = None
    project: str = "vit"  # the trackers' project (wandb project, MLflow experiment); each run is named run.name
    on_nonfinite: str = "stop"  # stop | skip
    max_steps: int | None = None  # stop early (smoke runs)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    aug: AugConfig = field(default_factory=AugConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)


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
    "data.dataset": ("digits", "imagefolder", "cifar10", "cifar100", "synthetic", "wds", "hf"),
    "data.on_bad_image": ("skip", "error"),
    "aug.interpolation": (*INTERPOLATIONS, None),
    "run.mixed_precision": ("no", "bf16", "fp16", "auto", None),
    "run.on_nonfinite": ("stop", "skip"),
}
POSITIVE = {"model.img_size", "model.patch_size", "model.in_chans", "model.embed_dim", "model.depth",
            "model.num_heads", "model.mlp_ratio", "data.batch_size", "data.eval_batch_size", "run.epochs",
            "optim.grad_accum_steps", "run.eval_every", "run.keep_best", "run.keep_states", "run.log_every",
            "run.max_steps",
            "data.synthetic_train_size", "data.synthetic_val_size", "data.synthetic_num_classes",
            "data.shuffle_buffer", "data.num_classes", "run.num_threads", "model.sparse_block_size",
            "model.sparse_topk_blocks", "model.sparse_density"}
NON_NEGATIVE = {"model.sparse_min_tokens", "optim.indexer_warmup_steps", "optim.lora_rank",
                "optim.lr", "optim.min_lr", "optim.weight_decay", "optim.warmup_epochs", "optim.clip_grad",
                "data.num_workers", "model.drop_rate", "model.attn_drop_rate", "model.drop_path_rate",
                "aug.mixup", "aug.cutmix", "aug.label_smoothing", "aug.color_jitter", "run.save_state_every",
                "aug.affine_translate", "aug.affine_rotate", "aug.affine_scale", "aug.rand_augment_ops"}
AUTO = {"data.num_workers", "run.num_threads"}
# run.log_with: csv is our metrics.csv; the others are Accelerate's trackers (accelerate.utils.LoggerType)
TRACKERS = ("tensorboard", "csv", "wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive", "swanlab", "trackio")
UNIT = {"data.val_fraction", "aug.hflip", "aug.random_erasing", "aug.mixup_prob", "model.drop_rate",
        "model.attn_drop_rate", "model.drop_path_rate", "aug.label_smoothing", "optim.layer_decay",
        "optim.ema_decay", "model.sparse_density"}
# model options that create_model takes but ModelConfig does not hold (they come from a weights' config.json)
ARG_POSITIVE, ARG_NON_NEGATIVE, ARG_UNIT = {"norm_eps"}, {"num_classes"}, {"pos_drop_rate"}


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
    for key in AUTO:  # a count or the word auto (resolved from the machine by vit.cli.runtime)
        if isinstance(flat[key], str) and flat[key] != "auto":
            raise ConfigError(f"config key '{key}' must be a number or 'auto', got {flat[key]!r}.")
    _check_ranges(flat, POSITIVE, NON_NEGATIVE, UNIT)
    m = cfg.model
    if m.sparse_topk_blocks is not None and m.sparse_density is not None:
        raise ConfigError("config keys 'model.sparse_topk_blocks' and 'model.sparse_density' both size the sparse "
                          "selection; set one of them.")
    sparse_set = [f"model.{k}" for k in ("sparse_topk_blocks", "sparse_density", "sparse_select", "sparse_own_block",
                                         "sparse_sink_block", "sparse_min_tokens") if getattr(m, k) is not None]
    if m.sparse_attention is None and sparse_set:
        raise ConfigError(f"config key '{sparse_set[0]}' sets sparse attention, which model.sparse_attention leaves "
                          "off; set it to dsa or moba, or leave the sparse keys out.")
    if cfg.optim.indexer_warmup_steps and m.sparse_attention != "dsa":
        raise ConfigError("config key 'optim.indexer_warmup_steps' trains DSA's indexer; set model.sparse_attention "
                          "to dsa or the warm-up to 0.")
    if cfg.optim.lora_rank and m.freeze:
        raise ConfigError("config keys 'model.freeze' and 'optim.lora_rank' both choose what trains; set one of them.")
    _validate_lists(cfg)
    _validate_run_name(cfg.run.name)
    for name in cfg.run.log_with or []:
        if name not in TRACKERS:
            raise ConfigError(f"config key 'run.log_with' names an unknown tracker {name!r}; choose from "
                              f"{', '.join(TRACKERS)}.")
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
    if cfg.data.dataset in ("wds", "hf") and not cfg.data.root:
        raise ConfigError(f"config key 'data.root' must name the {cfg.data.dataset} data to use (a shard folder "
                          "with _info.json, or a Hugging Face dataset saved on disk).")
    a = cfg.aug
    # in_chans null follows the data, or aug.mean/std where they are set (1 or 3 values pin the channels)
    given = len(a.mean or a.std or [None] * 3)
    check_preprocessing(dict(mean=a.mean, std=a.std, crop_pct=a.eval_crop_pct),
                        m.in_chans or (given if given in (1, 3) else 3),
                        lambda k: f"config key 'aug.{'eval_crop_pct' if k == 'crop_pct' else k}'",
                        lambda k: " (model.in_chans)" if k in ("mean", "std") else "")


# data.* keys that only some datasets read (data.dataset -> which); any other key applies to every dataset
DATASET_KEYS = {
    "root": ("imagefolder", "cifar10", "cifar100", "wds", "hf"), "download": ("cifar10", "cifar100"),
    "val_fraction": ("digits", "imagefolder"), "split_seed": ("digits", "imagefolder"),
    "synthetic_train_size": ("synthetic",), "synthetic_val_size": ("synthetic",),
    "synthetic_num_classes": ("synthetic",), "train_split": ("wds", "hf"), "val_split": ("wds", "hf"),
    "shuffle_buffer": ("wds",), "num_classes": ("wds", "hf"), "image_column": ("hf",), "label_column": ("hf",),
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
            out[key] = yaml.load(raw, Loader=StrictLoader)
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


class StrictLoader(yaml.SafeLoader):
    """yaml.safe_load, but a key given twice in one mapping is an error (PyYAML keeps the last one silently), and
    so is a document whose aliases expand to more than MAX_NODES values: a few hundred bytes of nested aliases
    ("billion laughs") become gigabytes the moment anything copies or prints the result."""

    MAX_NODES = 10_000

    def compose_document(self):
        node = super().compose_document()
        _expanded_size(node, {}, self.MAX_NODES)
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    key = self.construct_object(key_node)
                    if key in seen:
                        line = key_node.start_mark.line + 1
                        raise ConfigError(f"key '{key}' appears twice in one mapping (line {line}); keep one of them.")
                    seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.2's booleans: only true/false. PyYAML follows YAML 1.1, where yes/no/on/off (and y/n) are booleans too,
# so `--run.mixed_precision=no` (a documented value) arrived as False. Now such words stay strings, and a key typed
# bool takes them back in _check_type: `--run.compile=yes` still means true.
StrictLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:bool"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
YAML11_BOOLS = {"yes": True, "y": True, "on": True, "true": True, "no": False, "n": False, "off": False,
                "false": False}


def _expanded_size(node, memo: dict, limit: int) -> int:
    """Values in the document once every alias is copied out; counted on the node graph, never expanded."""
    if id(node) in memo:
        if memo[id(node)] is None:
            raise ConfigError("the YAML refers to itself through an alias (a recursive structure); remove the alias.")
        return memo[id(node)]
    memo[id(node)] = None
    children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else \
        node.value if isinstance(node, yaml.SequenceNode) else []
    size = 1 + sum(_expanded_size(c, memo, limit) for c in children)
    if size > limit:
        raise ConfigError(f"the YAML's aliases expand to more than {limit} values; write the values out instead.")
    memo[id(node)] = size
    return size


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist; pass --config with a path under configs/.")
    try:
        data = yaml.load(path.read_text(), Loader=StrictLoader)
    except UnicodeDecodeError:
        raise ConfigError(f"config file '{path}' is not UTF-8 text; pass a YAML file.") from None
    except ConfigError as e:
        raise ConfigError(f"config file '{path}': {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file '{path}' is not valid YAML: {str(e).splitlines()[0]}.") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of sections, got {type(data).__name__}.")
    return data or {}


def load_config(path: str | Path | None, overrides: list[str] | dict[str, Any] | None = None) -> Config:
    """The `Config` a YAML file (or the defaults, `path=None`) describes with `overrides` applied: command-line
    strings (`["--optim.lr=3e-4", "--run.epochs", "10"]`) or a {'section.key': value} dict. Loading is strict:
    an unknown key, a wrong type or an out-of-range value raises ConfigError naming the dotted key."""
    data = read_yaml(path) if path else {}
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    return from_dict(apply_overrides(data, overrides or {}))


def dump(cfg: Config) -> str:
    """The config as YAML (the form saved as config.yaml in every checkpoint; `load_config` reads it back)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


# --- data sources from saved configs ----------------------------------------------------------------------------
# A data source can run a command (`pipe:cmd`, which webdataset hands to a shell) or fetch from anywhere (a URL).
# It is honoured when the user typed it (command line, a config file they passed), never when it comes from a
# config saved in a folder they were handed (a checkpoint's config.yaml): `vit.models.checkpoint.load_checkpoint` marks
# such values with WITHHELD, and `vit.data.build_datasets` refuses a marked one unless the user passes it again.

SOURCE_KEYS = ("root", "train_split", "val_split")  # data.* keys that name where samples come from
WITHHELD = "withheld-saved-source:"  # prefix of a value withheld from a saved config; nothing opens such a name
_SCHEME = re.compile(r"(?:^|[^A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*:")  # pipe:, https:, s3:, ... anywhere


def is_remote_source(value: str | None) -> bool:
    """A value that names a command or a URL (any `scheme:`, also inside a brace pattern), not a local path."""
    return isinstance(value, str) and bool(_SCHEME.search(value))


def withhold_remote_sources(cfg: Config) -> list[str]:
    """Mark, in a config read from a saved folder, every data source that runs a command or fetches a URL, so
    that nothing builds a dataset from it (`check_data_sources`); the dotted keys marked."""
    marked = []
    for key in SOURCE_KEYS:
        value = getattr(cfg.data, key)
        if is_remote_source(value) and not value.startswith(WITHHELD):
            setattr(cfg.data, key, WITHHELD + value)
            marked.append(f"data.{key}")
    return marked


def check_data_sources(cfg: Config) -> None:
    """Refuse, in one sentence, a data source withheld from a saved config (see `withhold_remote_sources`)."""
    for key in SOURCE_KEYS:
        value = getattr(cfg.data, key)
        if isinstance(value, str) and value.startswith(WITHHELD):
            given = value[len(WITHHELD):]
            raise ConfigError(f"data.{key} {given!r} comes from a saved config (a checkpoint's config.yaml), and a "
                              "command or remote data source from a saved config is never run or fetched; if you "
                              f"trust it, pass it yourself: --data.{key}='{given}' on evaluate.py's command line "
                              f"(export.py: verify on --images), or set cfg.data.{key} in Python.")

