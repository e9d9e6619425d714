"""The model card every checkpoint folder carries: README.md, as the Hugging Face hub reads it.

A YAML metadata header (what `huggingface_hub.ModelCard` parses: library_name, tags, datasets, metrics, and the
evaluation in model-index form, which the hub shows as the model's results), then Markdown: what the model is,
how it was trained (the config's essentials, the teacher it was distilled from), its evaluation numbers, and how
to load it with `vit` and with `timm` (the folder is a timm hub folder: config.json in timm's format beside
model.safetensors).
Written from the config, classes and meta of `save_checkpoint`; standard library and PyYAML only.

Every string a user chose (class names, the run's and model's names, dataset and split names, the weights it
started from) goes through `markdown_text`, so a name such as `[x](http://evil)` or `<img onerror=...>` shows
as those characters and never becomes a link or HTML. The card names no place on the training machine: the
"from:" line gives a hub or timm registry name, or says the weights were local (`public_source`); a split given
as a path shows only its last component.
"""

from __future__ import annotations

import re
import string
from pathlib import PurePath

import yaml

from ..config import Config

__all__ = ["model_card", "markdown_text", "public_source", "LOCAL_DATASETS"]

# every ASCII punctuation character can be backslash-escaped in CommonMark; < > & as entities, which every
# Markdown renderer (and the hub's HTML sanitizer) reads as text
_ENTITIES = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}
_ESCAPED = {c: _ENTITIES.get(c, "\\" + c) for c in string.punctuation}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt", ".npz", ".ckpt")

# data.dataset values that are our own or local data, not a hub dataset id: the card's `datasets` names only
# the public ones (cifar10 and cifar100 are hub ids too)
LOCAL_DATASETS = {"imagefolder", "synthetic", "wds", "hf", "digits"}
HUB_DATASETS = {"cifar10": "uoft-cs/cifar10", "cifar100": "uoft-cs/cifar100"}


def markdown_text(text) -> str:
    """`text` as literal Markdown text: punctuation escaped (no link, image, emphasis, code or HTML can start),
    line breaks and other control characters as spaces (no new block)."""
    flat = re.sub(r"[\x00-\x1f\x7f\u2028\u2029]+", " ", str(text))
    return "".join(_ESCAPED.get(c, c) for c in flat)


def public_source(pretrained) -> str | None:
    """The name a model.pretrained value gives on the hub or in timm's registry (hf-hub:org/repo,
    vit_base_patch16_224.augreg_in21k), or None for a local file or folder (local-dir:, a path, a weights file),
    whose path would only describe the training machine."""
    if not isinstance(pretrained, str):
        return None
    text = pretrained.strip()
    if text.startswith(("hf-hub:", "hf_hub:")):
        return text
    if text.startswith("local-dir:") or any(c in text for c in "/\\~") or text.lower().endswith(WEIGHT_SUFFIXES):
        return None
    return text


def _place(name: str) -> str:
    """A split or dataset name, or a path's last component (`/data/shards/val-{0..9}.tar`: `val-{0..9}.tar`)."""
    return PurePath(name).name or name if any(c in name for c in "/\\") else name


def _repo_id(text: str) -> str:
    """`text` in the characters a hub repository id may hold, for the load examples' code blocks."""
    return "/".join(re.sub(r"[^A-Za-z0-9._-]+", "-", part).strip("-.") or "model" for part in text.split("/")[:2])


def _teacher_line(cfg: Config) -> list[str]:
    """The distillation line ([] without a teacher): the teacher by its public name (a local one unnamed), the
    kind and the weights."""
    d = cfg.distill
    if d.teacher is None:
        return []
    teacher = markdown_text(public_source(d.teacher) or "a local teacher (a folder on the training machine)")
    at = f" at temperature {d.temperature:g}"
    how = {"logit": "class scores" + at, "feature": f"{d.features} features, {d.feature_loss}",
           "token": f"DeiT's distillation token, {d.token_mode}" + (at if d.token_mode == "soft" else "")}[d.kind]
    return [f"- distilled from: {teacher} ({d.kind} distillation: {how}); the saved student needs no teacher"]


def model_card(cfg: Config, classes: list[str], meta: dict, num_params: int, repo_id: str | None = None) -> str:
    """README.md text for a checkpoint folder. `meta`: save_checkpoint's (epoch, step, val_acc1, val_loss, n);
    `repo_id`: the hub repository the load examples name (default: a placeholder, you/<run name>)."""
    m, d, o, a, r = cfg.model, cfg.data, cfg.optim, cfg.aug, cfg.run
    repo = _repo_id(repo_id or f"you/{r.name}")
    dataset = HUB_DATASETS.get(d.dataset, d.dataset)
    md = markdown_text
    if m.pretrained is True:
        source = f"timm's pretrained weights for {md(m.name)}"
    elif m.pretrained:
        source = md(public_source(m.pretrained) or "local weights (a file or folder on the training machine)")
    else:
        source = "random initialisation"
    model_name = public_source(m.name) or "a local model"
    acc, loss, n = meta.get("val_acc1"), meta.get("val_loss"), meta.get("n")
    header = _hub_header(cfg, acc, dataset)
    shown = ", ".join(md(c) for c in classes[:20]) + (f", ... ({len(classes)} in all)" if len(classes) > 20 else "")
    mixing = [f"{name} {alpha:g}" for name, alpha in (("mixup", a.mixup), ("cutmix", a.cutmix)) if alpha]
    held_out = {"imagefolder": "val/ (or a share of train/)", "digits": f"{d.val_fraction:.0%} held out"}
    lines = [
        "---", yaml.safe_dump(header, sort_keys=False).strip(), "---", "",
        f"# {md(r.name)}", "",
        f"A Vision Transformer image classifier ({md(model_name)} layout: {m.img_size}x{m.img_size} input"
        f"{f', {m.patch_size}-pixel patches' if m.patch_size else ''}"
        f"{f', depth {m.depth}' if m.depth else ''}{f', width {m.embed_dim}' if m.embed_dim else ''}"
        f"{f', {m.num_heads} heads' if m.num_heads else ''}, {m.in_chans} input channel(s), "
        f"{num_params / 1e6:.2f}M parameters) for {len(classes)} classes: {shown}.",
        "",
        "## Training", "",
        f"- data: {md(d.dataset)}, {d.batch_size} images per batch and process; validation: "
        f"{held_out.get(d.dataset, md(_place(d.val_split)))}",
        f"- from: {source}",
        *_teacher_line(cfg),
        f"- {r.epochs} epochs, AdamW lr {o.lr:g} (cosine to {o.min_lr:g}, {o.warmup_epochs:g} warm-up epochs), "
        f"weight decay {o.weight_decay:g}, gradient clip {o.clip_grad}, label smoothing {a.label_smoothing:g}"
        + (", " + ", ".join(mixing) if mixing else "") + (", EMA of the weights" if o.ema else ""),
        f"- preprocessing: mean {a.mean}, std {a.std}, {md(a.interpolation)} resize, centre crop {a.eval_crop_pct:g}",
        f"- precision {md(r.mixed_precision or 'no')}, seed {r.seed}; the full config is config.yaml in this folder",
        "",
        "## Evaluation", "",
    ]
    if isinstance(acc, (int, float)):
        lines.append(f"Validation top-1 accuracy {100 * acc:.2f}%" + (f", loss {loss:.4f}" if loss is not None else "")
                     + (f", on {n} images" if n else "") + f" (epoch {meta.get('epoch')}, step {meta.get('step')}).")
    else:
        lines.append("Not evaluated yet.")
    lines += _usage(repo)
    return "\n".join(lines)


def _hub_header(cfg: Config, acc, dataset: str) -> dict:
    """The card's YAML header, as the Hugging Face hub parses it: library, task, tags, datasets and the
    model-index with the validation top-1 when there is one."""
    d, r = cfg.data, cfg.run
    header: dict = {
        "library_name": "timm",
        "license": "apache-2.0",
        "pipeline_tag": "image-classification",
        "tags": ["image-classification", "vision-transformer", "timm", "vit-toolkit"],
    }
    if d.dataset not in LOCAL_DATASETS:
        header["datasets"] = [dataset]
    if isinstance(acc, (int, float)):
        header["metrics"] = ["accuracy"]
        header["model-index"] = [{"name": r.name, "results": [{
            "task": {"type": "image-classification", "name": "Image Classification"},
            "dataset": {"name": d.dataset, "type": dataset, "split": "validation"},
            "metrics": [{"type": "accuracy", "value": round(float(acc), 6), "name": "top-1 accuracy"}]}]}]
    return header


def _usage(repo: str) -> list[str]:
    """The card's "How to use" lines: loading through this toolkit and through timm."""
    return [
        "",
        "## How to use", "",
        "With this toolkit (`vit`), from the hub or from this folder:", "",
        "```python",
        "import vit",
        f'model = vit.create_model("hf-hub:{repo}", pretrained=True).eval()   # or "local-dir:<this folder>"',
        "```", "",
        "`python evaluate.py --checkpoint <this folder> ...` and `python predict.py --checkpoint <this folder> "
        "images/` use the preprocessing above. With timm:", "",
        "```python",
        "import timm",
        f'model = timm.create_model("hf-hub:{repo}", pretrained=True).eval()',
        "cfg = timm.data.resolve_data_config({}, model=model)   # the preprocessing above",
        "transform = timm.data.create_transform(**cfg)",
        "```", "",
    ]
