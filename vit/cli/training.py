"""train.py's command line to a run: the config with every null and `auto` resolved (`train_config`), the lines
printed once the Accelerator exists (`start_lines`) and the model it trains (`train_model`, `model_lines`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ..config import Config, check_dataset_keys, diff, load_config
from ..data import absolute_root, choose_channels, resolve_data_config
from ..models.build import build_model, pretrained_cfg_of, resolve_name
from ..models.clip_build import build_clip_model
from ..models.segmenter import build_segmenter, is_segmentation
from ..models.text_build import build_text_model
from ..models.vit_options import architecture_defaults
from ..train.console import describe_model, format_settings, processes
from ..train.lora import add_lora, trainable_share
from .runtime import apply_machine_defaults, single_process_note

__all__ = ["train_config", "start_lines", "train_model", "model_lines", "trained_note", "is_text", "is_contrastive"]


def is_text(cfg: Config) -> bool:
    """A text run (data.dataset=text_csv): token ids, no input channels nor image preprocessing."""
    return cfg.data.dataset == "text_csv"


def is_contrastive(cfg: Config) -> bool:
    """A contrastive run (data.dataset=captions): a CLIP model on image-caption pairs (vit/train/tasks)."""
    from ..train.tasks import task_name

    return task_name(cfg) == "contrastive"


def train_model(cfg: Config, num_classes: int, tokenizer=None) -> torch.nn.Module:
    """The model train.py trains, with the weights of model.pretrained if set: a text classifier for a text run
    (vit/models/text_build.py), a CLIP model for a contrastive run (vit/models/clip_build.py; `tokenizer`: the
    captions' own), a Segmenter for a segmentation run, else the image model the config describes, with LoRA
    adapters if optim.lora_rank is set."""
    if is_text(cfg):
        return build_text_model(cfg, num_classes)
    if is_contrastive(cfg):
        return build_clip_model(cfg, tokenizer)
    if is_segmentation(cfg):  # backbone + head (vit/models/segmenter.py); LoRA on the backbone, the head trained whole
        model = build_segmenter(cfg, num_classes, pretrained=True)
        if cfg.optim.lora_rank:
            add_lora(model.backbone, cfg.optim.lora_rank, cfg.optim.lora_alpha)
        return model
    model = build_model(cfg, num_classes, pretrained=True)
    if cfg.optim.lora_rank:  # adapters on the projections, merged into the weights on every save
        add_lora(model, cfg.optim.lora_rank, cfg.optim.lora_alpha)
    return model


def model_lines(cfg: Config, model: torch.nn.Module) -> list[str]:
    """What train.py prints about the model it built: its description (a text model by its weights' name) and the
    share of it that trains."""
    lines = [f"model: {describe_model(model, cfg.model.pretrained if is_text(cfg) else cfg.model.name)}"]
    return lines + ([trained_note(model)] if trained_note(model) else [])


def trained_note(model: torch.nn.Module) -> str | None:
    """'training N of M parameters (P%)' where part of the model learns (model.freeze, optim.lora_rank)."""
    trained, total = trainable_share(model)
    return f"training {trained:,} of {total:,} parameters ({100 * trained / total:.2f}%)" if trained < total else None


def train_config(config_path: str, overrides: list[str]) -> tuple[Config, str | None]:
    """(the config train.py runs, a line about the input channels to print or None): the YAML with `overrides`,
    nulls filled from the weights (architecture, preprocessing) and the data (channels), `auto` from this machine,
    data paths absolute."""
    cfg = resolve_name(load_config(config_path, overrides))  # model.name null: the architecture of the weights
    check_dataset_keys(cfg)  # a data.* key this dataset would ignore (data.val_split for a folder) is refused
    channel_note = None
    if is_contrastive(cfg):  # open_clip's image towers read RGB; a pretrained one, at its own size
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, in_chans=3))
        if cfg.contrastive.pretrained:
            clip = dataclasses.replace(cfg.model, name=None, pretrained=cfg.contrastive.pretrained)
            weights = pretrained_cfg_of(clip)
            cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, img_size=weights["input_size"][-1]))
            cfg = resolve_data_config(cfg, weights)
    if not is_text(cfg) and not (is_contrastive(cfg) and cfg.contrastive.pretrained):
        cfg, channel_note = choose_channels(cfg)  # model.in_chans null: the data's
        cfg = resolve_data_config(cfg, pretrained_cfg_of(cfg.model))  # the pretrained weights' preprocessing
    if cfg.data.naflex is not None and not cfg.model.patch_size:  # the data cuts images into the model's patches
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(
            cfg.model, patch_size=architecture_defaults(cfg.model.name)["patch_size"]))
    if cfg.pretrain.method == "dino" and cfg.pretrain.local_crops:  # local crops at their own size: positions resampled
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dynamic_img_size=True))
    cfg = apply_machine_defaults(cfg)  # threads, loader workers, precision: `auto` -> from this machine
    cfg.data.root = absolute_root(cfg.data.root)  # the saved config then works from any directory
    cfg.data.labels_file = absolute_root(cfg.data.labels_file)
    if cfg.distill.teacher is not None and Path(cfg.distill.teacher).is_dir():  # a checkpoint folder, from anywhere
        cfg.distill.teacher = str(Path(cfg.distill.teacher).absolute())
    return cfg, channel_note


def start_lines(accelerator, cfg: Config, config_path: str, overrides: list[str],
                channel_note: str | None = None) -> list[str]:
    """What train.py prints before the data is read: the settings that differ from the YAML, a launch that
    started one process of several, the device line, the channel note."""
    lines = [format_settings(diff(load_config(config_path), load_config(config_path, overrides)), config_path)]
    launch_note = single_process_note(accelerator)  # --num_processes 2 without --multi_gpu: one process ran
    if launch_note and accelerator.is_main_process:
        lines.append(launch_note)
    lines.append(f"device {accelerator.device}, {processes(accelerator)}, "
                 f"mixed precision {accelerator.mixed_precision}, {torch.get_num_threads()} thread(s), "
                 f"{cfg.data.num_workers} loader worker(s); full config: "
                 f"{Path(cfg.run.output_dir) / cfg.run.name / 'config.yaml'}")
    return lines + ([channel_note] if channel_note else [])
