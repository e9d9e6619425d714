"""Classifying images that have no labels: which files to read, which model and preprocessing to use (the same
as `evaluate.py`), and one prediction per readable image, in input order, on one process or many.

    paths, skipped = collect_images(["photos/", "more/*.jpg", "list.txt"])   # vit.cli.images: what to read
    out = predict_files(model, ImageFiles(paths, transform), 32, 0, accelerator)  # logits, ok, index
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from ..config import ConfigError, apply_overrides, from_dict, to_dict
from ..data.decode import BadImageError
from ..data.naflex import NaFlexTransform, collate_naflex, patchify
from ..data.resolve import resolve_data_config
from ..data.transforms import Pipeline
from ..hub.weights import load_pretrained, read_state_dict
from ..models.build import create_model
from ..models.checkpoint import CheckpointError, load_checkpoint
from .metrics import predict

__all__ = ["ImageFiles", "batch_of", "predict_files", "load_model_and_config",
           "label_names", "decode_error"]

class ImageFiles(Dataset):
    """Yields (image (C, S, S), readable 1/0, index). An unreadable file gives a zero image and 0, so a bad
    file costs one row of a batch, never the run; `decode_error` tells why, afterwards."""

    def __init__(self, paths: list[Path], transform: Pipeline | NaFlexTransform, in_chans: int = 3) -> None:
        self.paths, self.transform = list(paths), transform
        self.naflex = isinstance(transform, NaFlexTransform)  # a dict of patches per image (vit/data/naflex.py)
        self.collate = collate_naflex if self.naflex else None  # NaFlex batches are padded to their longest image
        size = transform.patch_size if self.naflex else transform.geometry.size
        self.shape = (in_chans, size, size)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor | dict, int, int]:
        try:  # a JPEG is decoded at the smallest scale the evaluation resize allows, as in evaluate.py
            return self.transform.load(self.paths[i]), 1, i
        except (BadImageError, ValueError):  # ValueError: e.g. a channel count the normalization cannot take
            blank = torch.zeros(self.shape)  # NaFlex: one zero patch
            return (patchify(blank, self.shape[1]) if self.naflex else blank), 0, i


def batch_of(dataset: ImageFiles, items: list[tuple]) -> torch.Tensor | dict:
    """Items of `dataset` ((image, readable, index) each) as one model input: images stacked (B, C, H, W), or a
    NaFlex batch padded to its longest image (the dataset's collate)."""
    if getattr(dataset, "collate", None) is not None:
        return dataset.collate([(it[0], 0) for it in items])[0]
    return torch.stack([it[0] for it in items])


def decode_error(path: Path, transform: Pipeline) -> str:
    """Why `path` could not be used (decoding again, only for the failed few)."""
    try:
        transform.load(path)
    except (BadImageError, ValueError) as e:  # PIL names the in-memory buffer it read: name the file instead
        return re.sub(r"<_io\.BytesIO object at 0x[0-9a-fA-F]+>", Path(path).name, str(e))
    return "unreadable when it was read (it has changed since)"


def predict_files(model, dataset: ImageFiles, batch_size: int, num_workers: int, accelerator) -> dict:
    """Logits (N, C), ok (N,) bool and index (N,) of every file, gathered on every process, in input order.
    The model and loader go through `accelerator.prepare`, and `vit.eval.metrics.predict` gathers with
    `gather_for_metrics` (which drops the samples repeated to even out the last batch): one row per file."""
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                        collate_fn=getattr(dataset, "collate", None))
    model, loader = accelerator.prepare(model, loader)
    out = predict(model, loader, accelerator)  # its "labels" slot carries our readable flag
    return {"logits": out["logits"], "ok": out["labels"].bool(), "index": out["index"]}


def label_names(model, num_classes: int) -> list[str]:
    """Class names for a model built by name: its pretrained config's `label_names` when it has them, the
    ImageNet-1k descriptions (from timm's offline tables) for a 1000-class head, else the indices."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    names = cfg.get("label_names") if isinstance(cfg, dict) else None
    if names and len(names) == num_classes:
        return [str(n) for n in names]
    if num_classes == 1000:
        try:
            from timm.data import ImageNetInfo

            info = ImageNetInfo()
            return [info.index_to_description(i) for i in range(1000)]
        except ImportError:
            pass
    return [str(i) for i in range(num_classes)]


def load_model_and_config(checkpoint: str | Path | None = None, model_name: str | None = None,
                          weights: str | Path | None = None, pretrained: bool = True, img_size: int | None = None,
                          dynamic_img_size: bool = False, overrides: dict | None = None):
    """(model in eval mode, config, class names or None, lines to show) from a `checkpoint` folder (train.py's), or
    `model_name` with the `weights` of a timm file or, `pretrained`, its weights by name from the hub cache. The
    config's aug.* section gives the evaluation preprocessing: the weights' own (timm's pretrained_cfg) unless
    `overrides` ({"aug.eval_crop_pct": 1.0, ...}) say otherwise. Nothing is printed: the lines say what loaded."""
    overrides = overrides or {}
    if checkpoint:
        model, cfg, classes, _ = load_checkpoint(checkpoint)
        return model, from_dict(apply_overrides(to_dict(cfg), overrides)), classes, []
    if not model_name:
        raise ConfigError("name a model to load: a checkpoint folder (--checkpoint) or a model name (--model).")
    cfg = from_dict(apply_overrides({"model": {"name": model_name, "img_size": img_size or 224}}, overrides))
    lines = []
    if weights:
        state = read_state_dict(weights)
        if "head.weight" not in state:
            raise CheckpointError(f"{weights} has no classifier head (head.weight); it cannot classify.")
        model = create_model(model_name, img_size=cfg.model.img_size, num_classes=state["head.weight"].shape[0],
                             dynamic_img_size=dynamic_img_size)
        lines.append(str(load_pretrained(model, weights)))
    elif pretrained:  # named weights: their class count, and their size unless `img_size`
        model = create_model(model_name, pretrained=True, dynamic_img_size=dynamic_img_size,
                             **({"img_size": img_size} if img_size else {}))
        cfg.model.img_size = model.patch_embed.img_size[0]
    else:
        raise ConfigError("--model needs --weights FILE (a timm checkpoint) or --pretrained; or pass --checkpoint.")
    cfg = resolve_data_config(cfg, getattr(model, "pretrained_cfg", None) or {}, model.in_chans)
    return model.eval(), cfg, None, lines
