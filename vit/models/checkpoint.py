"""Model checkpoints: folders written atomically, read without unpickling anything.

A model checkpoint is a folder holding `model.safetensors` (weights), `config.yaml` (the resolved config),
`classes.json` and `meta.json` (epoch, step, metrics): everything `evaluate.py` needs. Each file is written
into a temporary folder beside it, fsync'ed, and the folder is swapped in as a whole (vit/utils/atomic.py:
replace_dir), so a process killed mid-save leaves the previous complete checkpoint, weights and meta.json
together. Training states (optimizer, RNG, step: what a resume reads) are another thing with another home,
vit/train/state.py. File writing itself lives in vit/utils/atomic.py, the test-only crash hooks (`fault_point`)
in vit/utils/faults.py.

A CLIP model's checkpoint (data.dataset captions) is an open_clip repository (vit/models/clip_save.py), which
`vit.create_clip_model("local-dir:<folder>")` and open_clip load, with config.yaml and meta.json beside it.

A text classifier's checkpoint (vit.models.text_classifier, data.dataset text_csv) is a transformers repository
besides (vit/models/text_save.py: transformers' config.json and weight names, the tokenizer files), so that
`AutoModelForSequenceClassification.from_pretrained(<folder>)` loads it too.

Every image checkpoint folder also holds `config.json` in timm's hub format (architecture, num_classes, label_names,
model_args, pretrained_cfg): it is a timm hub repository, for `timm.create_model("local-dir:<folder>",
pretrained=True)` or `huggingface_hub.upload_folder` as it is.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from ..config import DEFAULT_MODEL, Config, dump, from_dict, read_yaml, withhold_remote_sources
from ..hub.hub_config import split_tag, timm_config
from ..hub.weights import check_finite, check_weights
from ..utils.atomic import atomic_write_bytes, atomic_write_text, staged_dir
from ..utils.faults import fault_point
from .build import build_model
from .clip import CLIP
from .clip_save import save_clip_model
from .model_card import model_card
from .segmenter import Segmenter, build_segmenter, is_segmentation
from .text_build import create_text_model
from .text_classifier import TextClassifier
from .text_save import save_text_model
from .vision_transformer import VisionTransformer
from .vit_options import architecture_defaults

log = logging.getLogger(__name__)
# Written into model.safetensors' metadata by save_checkpoint: the fixed sin-cos position table follows
# big_vision's posemb_sincos_2d since this marker exists; a sincos checkpoint without it used the earlier table.
SINCOS_MARK = ("pos_embed_sincos", "big_vision")

__all__ = ["save_checkpoint", "load_checkpoint", "is_text_checkpoint", "CheckpointError"]


class CheckpointError(ValueError):
    """A checkpoint that is missing, incomplete or from another model; the message says which."""




def save_checkpoint(folder: str | Path, model: torch.nn.Module, cfg: Config, classes: list[str],
                    meta: dict | None = None, state_dict: dict | None = None) -> Path:
    """Write a self-contained model checkpoint folder (weights, config, classes, meta), file by file atomically.
    `state_dict`: the weights to write instead of `model.state_dict()` (FSDP: accelerator.get_state_dict's
    consolidated copy, gathered on every process, as the model holds only this process's shards)."""
    folder = Path(folder)
    if isinstance(model, CLIP):  # open_clip's layout (vit/models/clip_save.py), with our files beside it
        aug = cfg.aug.resolved(None, 3)
        extra = {"config.yaml": dump(cfg), "meta.json": json.dumps(meta or {}, indent=1)}
        if classes:
            extra["classes.json"] = json.dumps(classes, indent=1)
        return save_clip_model(model, folder, state_dict, extra,
                               preprocess=dict(mean=aug.mean, std=aug.std, interpolation=aug.interpolation))
    if isinstance(model, TextClassifier):  # transformers' layout, with our files beside it
        extra = {"config.yaml": dump(cfg), "classes.json": json.dumps(classes, indent=1),
                 "meta.json": json.dumps(meta or {}, indent=1)}
        return save_text_model(folder, model, classes, extra=extra, state_dict=state_dict)
    if isinstance(model, Segmenter):  # backbone + head (backbone.*, head.*); no timm hub config: not a timm model
        return _save_segmenter(folder, model, cfg, classes, meta, state_dict)
    weights = model.state_dict() if state_dict is None else state_dict
    state = {k: v.detach().cpu().contiguous() for k, v in weights.items()}
    check_finite(state, f"refusing to save {folder}", "lower optim.lr or enable optim.clip_grad.")
    # the preprocessing the data pipeline used: train.py resolves it from the weights first; what is still unset
    # got build_transform's fallbacks, and the saved config says so (not the registry's values for the name)
    # the config names what was built where it left the choice to the weights or the data (model.name, in_chans)
    built = dict(name=cfg.model.name or getattr(model, "_variant", None) or DEFAULT_MODEL,
                 in_chans=cfg.model.in_chans or getattr(model, "in_chans", None))
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **built))
    cfg = dataclasses.replace(cfg, aug=cfg.aug.resolved(None, cfg.model.in_chans))
    # the whole folder at once: written beside it, then swapped in (a kill between files leaves the old one whole)
    with staged_dir(folder) as tmp:
        metadata = {"format": "pt", "model": cfg.model.name, SINCOS_MARK[0]: SINCOS_MARK[1]}
        atomic_write_bytes(tmp / "model.safetensors", save(state, metadata=metadata))
        fault_point("checkpoint", int((meta or {}).get("step", -1)))
        atomic_write_text(tmp / "config.yaml", dump(cfg))
        atomic_write_text(tmp / "classes.json", json.dumps(classes, indent=1))
        atomic_write_text(tmp / "meta.json", json.dumps(meta or {}, indent=1))
        # timm's hub format beside ours: timm.create_model("local-dir:<folder>", pretrained=True) rebuilds the model
        arch = (getattr(model, "pretrained_cfg", None) or {}).get("architecture") or split_tag(cfg.model.name)
        if getattr(model, "head_dist", None) is not None and not architecture_defaults(arch).get("dist_token"):
            # a distillation token on a plain ViT name (model.dist_token=true): timm builds that only as its
            # VisionTransformerDistilled, so name a DeiT distilled variant and let model_args set the sizes
            arch = "deit_tiny_distilled_patch16_224"
        aug = cfg.aug  # resolved above: what the pipeline used
        data = dict(mean=aug.mean, std=aug.std, crop_pct=aug.eval_crop_pct, interpolation=aug.interpolation)
        timm = timm_config(model, arch, classes, data, architecture_defaults(arch))
        atomic_write_text(tmp / "config.json", json.dumps(timm, indent=2))
        num_params = sum(v.numel() for v in state.values())
        atomic_write_text(tmp / "README.md", model_card(cfg, classes, meta or {}, num_params))  # the hub's card
    return folder


_BN_COUNTER = "num_batches_tracked"


def _save_segmenter(folder: Path, model: Segmenter, cfg: Config, classes: list[str], meta: dict | None,
                    state_dict: dict | None) -> Path:
    weights = model.state_dict() if state_dict is None else state_dict
    # BatchNorm's step counter (int64, read only when its momentum is None, which the heads' is not) is left out:
    # a checkpoint holds float tensors alone (check_weights)
    state = {k: v.detach().cpu().contiguous() for k, v in weights.items() if not k.endswith(_BN_COUNTER)}
    check_finite(state, f"refusing to save {folder}", "lower optim.lr or enable optim.clip_grad.")
    built = dict(name=cfg.model.name or DEFAULT_MODEL, in_chans=cfg.model.in_chans or model.backbone.in_chans)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **built))
    cfg = dataclasses.replace(cfg, aug=cfg.aug.resolved(None, cfg.model.in_chans))
    with staged_dir(folder) as tmp:
        metadata = {"format": "pt", "model": cfg.model.name, "task": "segmentation", SINCOS_MARK[0]: SINCOS_MARK[1]}
        atomic_write_bytes(tmp / "model.safetensors", save(state, metadata=metadata))
        atomic_write_text(tmp / "config.yaml", dump(cfg))
        atomic_write_text(tmp / "classes.json", json.dumps(classes, indent=1))
        atomic_write_text(tmp / "meta.json", json.dumps(meta or {}, indent=1))
    return folder


def is_text_checkpoint(folder: str | Path) -> bool:
    """Whether `folder` holds a text classifier's checkpoint (transformers' config.json, with a model_type);
    False for an image checkpoint and for anything unreadable (load_checkpoint then says what is wrong)."""
    try:
        saved = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and "model_type" in saved and "architecture" not in saved


def load_checkpoint(folder: str | Path) -> tuple[VisionTransformer, Config, list[str], dict]:
    """Read a checkpoint folder written by `save_checkpoint` -> (model in eval mode, config, classes, meta)."""
    folder = Path(folder)
    if folder.is_file() and folder.name == "model.safetensors":
        folder = folder.parent
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint {folder} does not exist; pass a run's best/ or last/ folder.")
    if (folder / "open_clip_config.json").is_file() and not (folder / "model.safetensors").is_file():
        raise CheckpointError(f"checkpoint {folder} is a CLIP model (a contrastive run's); score it zero-shot with "
                              f"--clip local-dir:{folder} --classes ... (demo.py: --labels ...), or load it with "
                              "vit.create_clip_model.")
    missing = [n for n in ("model.safetensors", "config.yaml", "classes.json") if not (folder / n).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {folder} is incomplete (no {', '.join(missing)}); "
                              "pass a folder written by train.py.")
    try:
        cfg = from_dict(read_yaml(folder / "config.yaml"))
        classes = json.loads((folder / "classes.json").read_text())
        backbone = cfg.pretrain.method is not None  # a pretrained backbone (pretrain.method) has no classes
        if not isinstance(classes, list) or not (classes or backbone) or not all(isinstance(c, str) for c in classes):
            raise ValueError("classes.json must hold a non-empty list of class names")
        meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").is_file() else {}
        state = load_file(str(folder / "model.safetensors"))
        saved = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else None
        text = is_text_checkpoint(folder)
        if saved is not None and not text and not isinstance(saved.get("architecture"), str):
            raise ValueError("config.json names no architecture")
    except Exception as e:  # bad YAML/JSON, a config error, a file that is not safetensors, ...
        raise CheckpointError(f"checkpoint {folder} is unreadable ({str(e).splitlines()[0]}).") from None
    withhold_remote_sources(cfg)  # a pipe: or URL data source from a folder one was handed is never run or fetched
    try:
        check_weights(state, folder / "model.safetensors")  # non-float or non-finite: refused, not cast
    except (ValueError, FloatingPointError) as e:
        raise CheckpointError(str(e)) from None
    if text:  # a text classifier: its transformers folder, read as create_text_model reads any
        try:
            model = create_text_model(f"local-dir:{folder}", num_classes=len(classes))
        except (ValueError, FileNotFoundError) as e:
            raise CheckpointError(f"checkpoint {folder} does not load ({str(e).splitlines()[0]}).") from None
        # its tokenizer is the folder's own copy (data is tokenised from model.pretrained's)
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, pretrained=f"local-dir:{folder}"))
        return model.eval(), cfg, classes, meta
    model = build_segmenter(cfg, len(classes)) if is_segmentation(cfg) else build_model(cfg, len(classes), saved=saved)
    own = {k: v for k, v in model.state_dict().items() if not k.endswith(_BN_COUNTER)}  # a Segmenter's are not saved
    bad = [k for k in own if k not in state or state[k].shape != own[k].shape] + [k for k in state if k not in own]
    if bad:
        raise CheckpointError(f"checkpoint {folder} does not match its own config ({bad[0]} differs); "
                              "it is from another architecture or was edited.")
    model.load_state_dict(state, strict=False)  # every key checked above; BatchNorm's counters keep their zeros
    marked = _metadata(folder / "model.safetensors").get(SINCOS_MARK[0]) == SINCOS_MARK[1]
    if cfg.model.pos_embed == "sincos" and not marked:
        log.warning("%s was trained with the earlier sin-cos position table (y before x, other frequencies); this "
                    "version computes big_vision's, so its accuracy may drop: fine-tune or retrain it.", folder)
    # preprocessing the config leaves unset (a hand-written or older checkpoint) follows config.json's, as in timm
    pretrained_cfg = saved.get("pretrained_cfg") if saved else None
    aug = cfg.aug.resolved(pretrained_cfg if isinstance(pretrained_cfg, dict) else None, cfg.model.in_chans)
    return model.eval(), dataclasses.replace(cfg, aug=aug), classes, meta


def _metadata(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.metadata() or {}


