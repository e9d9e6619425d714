"""Attention maps of a batch of images drawn and saved: the picture (input | heatmap | overlay), the raw patch-grid
map (.npy) and a sidecar (.json: method, settings, top-5), and with token reduction which patches became one
token; what visualize_attention.py writes. The maps are vit/explain/rollout.py's.

    maps = draw_attention(model, cfg, classes, collect_inputs(["img.png"], cfg, classes), Path("attn"))
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..data import DataError
from ..data.decode import BadImageError
from ..data.transforms import build_transform
from ..eval.plots import plot_attention_map, save_figure, to_display
from ..layers.token_reduction import TopK
from ..utils.atomic import atomic_write_bytes, atomic_write_text
from .rollout import attention_maps

__all__ = ["MapOptions", "AttentionFiles", "draw_attention", "settings_text", "resolve_target", "token_groups",
           "plot_tokens"]


@dataclass(frozen=True)
class MapOptions:
    """Which map and its settings (vit.explain.rollout.attention_maps): `method` rollout | grad_rollout |
    attention, how heads fuse, the share of weakest attention discarded, the first block rolled out, the weight
    of the residual (identity) path, and the block whose raw attention is shown."""

    method: str = "rollout"
    head_fusion: str = "mean"
    discard_ratio: float = 0.0
    start_layer: int = 0
    residual_alpha: float = 0.5
    layer: int = -1


@dataclass
class AttentionFiles:
    """What draw_attention wrote: one sidecar dict per map (its .json's content) and why each unreadable file was
    skipped."""

    sidecars: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def settings_text(opts: MapOptions, depth: int) -> str:
    """The method and the settings that shaped the map (only those it uses), for the picture's title."""
    if opts.method == "attention":
        return f"raw attention of block {opts.layer % depth} (of 0-{depth - 1}), heads: {opts.head_fusion}"
    if opts.method == "grad_rollout":  # gradient-weighted heads: no fusion, discarding or residual weight
        return f"grad rollout, blocks {opts.start_layer}-{depth - 1}"
    return (f"rollout, heads: {opts.head_fusion}, discard ratio {opts.discard_ratio:g}, "
            f"blocks {opts.start_layer}-{depth - 1}, residual alpha {opts.residual_alpha:g}")


def resolve_target(target: str | None, classes: list[str]) -> int | None:
    """A class name or index as the class index the map explains; None: the prediction's."""
    if target is None:
        return None
    if target in classes:
        return classes.index(target)
    if target.lstrip("-").isdigit() and 0 <= int(target) < len(classes):
        return int(target)
    raise DataError(f"--target-class {target!r} is neither a class name nor an index below {len(classes)}.")


def token_groups(model, grid: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """After a tracked forward: (B, h, w) index of the final token that stands for each patch (-1 for EViT's
    fused token of inattentive patches) and (B, h, w) that token's size in patches."""
    tokens = model.blocks.last_tokens
    p = model.num_prefix_tokens
    source = tokens.source[:, p:, p:]  # (B, tokens, patches)
    labels = source.argmax(1)  # (B, patches)
    sizes = tokens.size[:, p:, 0].gather(1, labels)
    if isinstance(model.blocks[max(i for i, b in enumerate(model.blocks) if b.token_reduction is not None)]
                  .token_reduction, TopK):  # top-k fuses the dropped patches into the last token
        labels = labels.masked_fill(labels == source.shape[1] - 1, -1)
    B = labels.shape[0]
    return labels.reshape(B, *grid).numpy(), sizes.reshape(B, *grid).numpy()


def plot_tokens(path: Path, image: np.ndarray, labels: np.ndarray, sizes: np.ndarray, title: str) -> None:
    """Input | merged groups (one colour per token of 2+ patches, dark: fused away, clear: kept alone)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    h, w = image.shape[:2]
    colours = colormaps["tab20"](np.arange(20))
    over = np.zeros((*labels.shape, 4))
    merged = (sizes > 1) & (labels >= 0)
    over[merged] = colours[labels[merged] % 20]
    over[merged, 3] = 0.6
    over[labels < 0] = (0.0, 0.0, 0.0, 0.75)
    fig = Figure(figsize=(6.4, 3.4))
    axes = fig.subplots(1, 2)
    axes[0].imshow(image)
    axes[0].set_title("input")
    axes[1].imshow(image)
    axes[1].imshow(over, extent=(-0.5, w - 0.5, h - 0.5, -0.5), interpolation="nearest")
    axes[1].set_title("merged (colour) / dropped (dark)")
    for a in axes:
        a.axis("off")
    fig.suptitle(title)
    save_figure(fig, path, dpi=100)


def _decode(items, transform, cfg) -> tuple[list, list, list, list[str]]:
    """(model inputs, the images as shown, names, why each unreadable file was skipped) for one batch of
    `collect_inputs` items."""
    batch, shown, names, skipped = [], [], [], []
    for name, src, _ in items:
        try:  # a file is decoded at the smallest JPEG scale the evaluation resize allows
            x = transform(src) if isinstance(src, np.ndarray) else transform.load(src)
        except BadImageError as e:
            skipped.append(str(e))
            continue
        batch.append(x)
        names.append(name)
        shown.append(to_display(x, cfg.aug.mean, cfg.aug.std))  # what the model saw, in [0, 1]
    return batch, shown, names, skipped


def draw_attention(model, cfg, classes: list[str], items: list[tuple], out: Path, opts: MapOptions = MapOptions(),
                   target_class: str | None = None, batch_size: int = 16, show_tokens: bool = False,
                   about: dict | None = None) -> AttentionFiles:
    """<name>_<method>.png / .npy / .json in `out` for every readable image of `items` (collect_inputs'), in
    batches through `cfg`'s evaluation preprocessing; the map explains `target_class` (a name or index) or the
    prediction. `show_tokens` adds <name>_tokens.png / .npy (a model with token reduction). `about`: what the
    sidecars name as checkpoint, model and token_reduction."""
    if cfg.data.naflex is not None:  # the square preprocessing below would squash each image to one square size
        from ..config import ConfigError

        raise ConfigError("visualize_attention.py draws maps on square images, and this checkpoint reads each image "
                          "at its own aspect ratio (data.naflex); draw its per-image rollout with predict.py "
                          "--checkpoint ... --cam (docs/naflex.md).")
    about = {"checkpoint": None, "model": None, "token_reduction": cfg.model.token_reduction, **(about or {})}
    target = resolve_target(target_class, classes)
    settings = settings_text(opts, len(model.blocks))
    transform = build_transform(cfg.aug, cfg.model.img_size, train=False)
    truths = {name: truth for name, _, truth in items}
    sources = {name: str(src) if isinstance(src, Path) else name for name, src, _ in items}  # for the sidecar
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    params = {k: v for k, v in asdict(opts).items() if k != "method"}
    done = AttentionFiles()
    for start in range(0, len(items), batch_size):
        batch, shown, names, bad = _decode(items[start : start + batch_size], transform, cfg)
        done.skipped += bad
        if not batch:
            continue
        tgt = None if target is None else torch.full((len(batch),), target, dtype=torch.long)
        maps, logits = attention_maps(model, torch.stack(batch), opts.method, tgt, opts.head_fusion,
                                      opts.discard_ratio, opts.start_layer, opts.layer, opts.residual_alpha)
        groups = token_groups(model, maps.shape[1:]) if show_tokens else None
        top_p, top_i = logits.softmax(1).topk(min(5, len(classes)), dim=1)
        for j, name in enumerate(names):
            pred, grid_map = int(top_i[j, 0]), maps[j].numpy()
            stem = out / f"{name}_{opts.method}"
            _save_npy(stem.with_suffix(".npy"), grid_map)
            explained = classes[target] if target is not None else classes[pred]
            truth = f"true {truths[name]}, " if truths[name] is not None else ""
            title = (f"{name}: {truth}predicted {classes[pred]} ({100 * float(top_p[j, 0]):.1f}%)"
                     + (f", map for '{explained}'" if opts.method == "grad_rollout" else "") + f"\n{settings}")
            plot_attention_map(stem.with_suffix(".png"), shown[j], grid_map, title)
            sidecar = dict(image=name, source=sources[name], method=opts.method, params=params,
                           explained_class=explained, true_class=truths[name], title=title,
                           grid=list(grid_map.shape), **about,
                           top5=[dict(cls=classes[int(i)], index=int(i), prob=float(p))
                                 for p, i in zip(top_p[j], top_i[j])])
            atomic_write_text(stem.with_suffix(".json"), json.dumps(sidecar, indent=1))
            if groups is not None:
                _write_tokens(out, name, shown[j], groups[0][j], groups[1][j], about["token_reduction"])
            done.sidecars.append(sidecar)
    return done


def _save_npy(path: Path, array: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, array)
    atomic_write_bytes(path, buf.getvalue())


def _write_tokens(out: Path, name: str, shown, labels, sizes, spec: str) -> None:
    """<name>_tokens.npy (each patch's token id) and <name>_tokens.png (the merged tokens drawn)."""
    _save_npy(out / f"{name}_tokens.npy", labels)
    left = len(np.unique(labels[labels >= 0])) + int((labels < 0).any())
    plot_tokens(out / f"{name}_tokens.png", shown, labels, sizes,
                f"{name}: {left} tokens for {labels.size} patches ({spec})")

