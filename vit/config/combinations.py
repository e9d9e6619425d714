"""The checks between a run's sections: what a dataset can give (balancing, labels files, shards, NaFlex batches),
what a contrastive run reads, what a distillation needs (distill_checks.py), what pretraining needs
(pretrain_checks.py), which training options a model's
options need, and the data.* keys a dataset ignores (refused rather than ignored)."""

from __future__ import annotations

import dataclasses

from .checks import LOG_SCALE_RANGE, check_sections
from .distill_checks import validate_distill
from .errors import ConfigError
from .pretrain_checks import validate_pretrain
from .schema import Config, ContrastiveConfig, DataConfig
from .seg_checks import validate_seg


def validate(cfg: Config) -> None:
    """Every check a type cannot express, each naming its key: within the sections (checks.py), then settings of
    different sections that cannot work together."""
    check_sections(cfg)
    m = cfg.model
    if cfg.optim.indexer_warmup_steps and getattr(m.sparse_attention, "method", None) != "dsa":
        raise ConfigError("config key 'optim.indexer_warmup_steps' trains DSA's indexer; set "
                          "model.sparse_attention.method to dsa or the warm-up to 0.")
    if cfg.optim.lora_rank and m.freeze:
        raise ConfigError("config keys 'model.freeze' and 'optim.lora_rank' both choose what trains; set one of them.")
    _validate_lora(cfg)
    if cfg.data.dataset == "imagefolder" and not cfg.data.root:
        raise ConfigError("config key 'data.root' must name the ImageFolder (with train/ and val/) to use.")
    _validate_data_use(cfg)
    _validate_contrastive(cfg)
    validate_distill(cfg)  # vit/config/distill_checks.py
    validate_pretrain(cfg)  # vit/config/pretrain_checks.py
    validate_seg(cfg)  # vit/config/seg_checks.py


LORA_MAX_SCALE = 100  # alpha / rank: published recipes use 0.5 to 4 (rsLoRA's alpha / sqrt(rank) about 8)


def _validate_lora(cfg: Config) -> None:
    """LoRA adapts the image ViT's projections (vit.train.lora), scaled by lora_alpha / lora_rank."""
    rank, alpha = cfg.optim.lora_rank, cfg.optim.lora_alpha
    if alpha is not None and not rank:
        raise ConfigError("config key 'optim.lora_alpha' is read only with optim.lora_rank, which is 0 (no LoRA); set "
                          "optim.lora_rank (8, say) or remove optim.lora_alpha.")
    if rank and cfg.data.dataset == "text_csv":  # the text model is fine-tuned whole: the rank was never read
        raise ConfigError("config key 'optim.lora_rank' adapts the image ViT's projections; a text run "
                          "(data.dataset=text_csv) fine-tunes its whole text model: remove optim.lora_rank.")
    if rank and alpha is not None and not 0 < alpha / rank <= LORA_MAX_SCALE:
        raise ConfigError(f"config key 'optim.lora_alpha' ({alpha:g}) over optim.lora_rank ({rank}) scales the LoRA "
                          f"update by {alpha / rank:g}, which must be above 0 (0 trains the head alone) and at most "
                          f"{LORA_MAX_SCALE} (larger overflows to NaN); published recipes use 0.5 to 4.")


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


NAFLEX_DATASETS = ("imagefolder", "digits", "cifar10", "cifar100", "synthetic", "segmentation")  # sizes known


def _validate_naflex(cfg: Config) -> None:
    """data.naflex batches images of many sizes by their patch counts, known before any image is decoded."""
    d, a = cfg.data, cfg.aug
    if d.dataset not in NAFLEX_DATASETS or d.labels_file:
        raise ConfigError(f"config key 'data.naflex' needs every image's size before the epoch starts, which "
                          f"data.dataset={d.dataset!r}" + (" with data.labels_file" if d.labels_file else "") +
                          f" does not give; use one of {', '.join(NAFLEX_DATASETS)} (single-label where labelled), "
                          "or remove data.naflex.")
    if a.mixup or a.cutmix:
        raise ConfigError("config keys 'aug.mixup' and 'aug.cutmix' mix images of one size, and data.naflex gives "
                          "each image its own; set both to 0 or remove data.naflex.")
    if d.sampler != "shuffle":
        raise ConfigError(f"config key 'data.sampler' is {d.sampler!r}, and data.naflex batches by patch budget with "
                          "its own shuffle; set data.sampler=shuffle (optim.class_weights=auto balances classes).")


# data.* keys that only some datasets read (data.dataset -> which); any other key applies to every dataset
DATASET_KEYS = {
    "root": ("imagefolder", "cifar10", "cifar100", "wds", "hf", "text_csv", "captions", "segmentation"),
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
