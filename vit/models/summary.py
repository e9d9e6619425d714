"""Trace the data's path through a model: each stage's output shape, parameters and FLOPs.

    python summary.py vit_base_patch16_224 [--img-size 224] [--batch-size 1] [--num-classes 1000]   # the command

FLOPs are counted by PyTorch's `FlopCounterMode` with CPU flash attention added (vit/utils/perf.py) and
attributed to the module that ran them; a multiply-add counts as 2 FLOPs, so they are twice the "GMACs" of
timm's tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..utils.perf import flop_counter
from .vision_transformer import VisionTransformer

__all__ = ["summarize", "format_summary"]


@dataclass
class Row:
    name: str
    kind: str
    shape: tuple[int, ...]
    params: int
    flops: int


def _stages(model: VisionTransformer) -> list[tuple[str, nn.Module]]:
    stages = [("patch_embed", model.patch_embed), ("norm_pre", model.norm_pre)]
    for i, blk in enumerate(model.blocks):
        stages += [(f"blocks.{i}.attn", blk.attn), (f"blocks.{i}.mlp", blk.mlp), (f"blocks.{i}", blk)]
    stages += [("norm", model.norm), ("attn_pool", model.attn_pool), ("fc_norm", model.fc_norm), ("head", model.head),
               ("head_dist", model.head_dist)]
    # parts a model does not have (None, or an Identity where an option is off) are not stages; `norm` always is
    return [(n, m) for n, m in stages if m is not None and (n == "norm" or not isinstance(m, nn.Identity))]


def summarize(model: VisionTransformer, x: torch.Tensor) -> list[Row]:
    """Run `x` through `model` once and report every stage in execution order."""
    shapes: dict[str, tuple[int, ...]] = {}
    handles = []
    for name, mod in _stages(model):
        def hook(_m, _inp, out, name=name):
            out = out[0] if isinstance(out, tuple) else out
            shapes[name] = tuple(out.shape)
        handles.append(mod.register_forward_hook(hook))
    # the full path (every token through every block), not forward()'s [CLS]-only last block
    pruned, model.prune_last_block = model.prune_last_block, False
    try:
        with torch.no_grad(), flop_counter() as counter:
            model(x)
    finally:
        model.prune_last_block = pruned
        for h in handles:
            h.remove()
    per_module = counter.get_flop_counts()
    rows = [Row("input", "image", tuple(x.shape), 0, 0)]
    for name, mod in _stages(model):
        if name not in shapes:
            continue
        flops = sum(per_module.get(f"VisionTransformer.{name}", {}).values())
        rows.append(Row(name, type(mod).__name__, shapes[name], sum(p.numel() for p in mod.parameters()), flops))
    rows.append(Row("total", "", tuple(shapes.get("head", ())), sum(p.numel() for p in model.parameters()),
                    counter.get_total_flops()))
    return rows


def format_summary(rows: list[Row]) -> str:
    lines = [f"{'stage':<18}{'module':<20}{'output shape':<22}{'params':>14}{'GFLOPs':>10}"]
    lines.append("-" * len(lines[0]))
    for r in rows:
        if r.name == "total":
            lines.append("-" * len(lines[0]))
        lines.append(f"{r.name:<18}{r.kind:<20}{str(list(r.shape)):<22}{r.params:>14,}{r.flops / 1e9:>10.3f}")
    return "\n".join(lines)
