"""Trace the data's path through a model: each stage's output shape, parameters and FLOPs.

    python -m vit.models.summary vit_base_patch16_224 [--img-size 224] [--batch-size 1] [--num-classes 1000]

FLOPs are counted by PyTorch's `FlopCounterMode` with CPU flash attention added (vit/utils/perf.py) and attributed to
the module that ran them; a multiply-add counts as 2 FLOPs, so they are twice the "GMACs" of timm's tables.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from torch import nn

from ..utils.perf import flop_counter
from .vision_transformer import VisionTransformer, create_model

__all__ = ["summarize", "format_summary"]


@dataclass
class Row:
    name: str
    kind: str
    shape: tuple[int, ...]
    params: int
    flops: int


def _stages(model: VisionTransformer) -> list[tuple[str, nn.Module]]:
    stages = [("patch_embed", model.patch_embed)]
    for i, blk in enumerate(model.blocks):
        stages += [(f"blocks.{i}.attn", blk.attn), (f"blocks.{i}.mlp", blk.mlp), (f"blocks.{i}", blk)]
    return stages + [("norm", model.norm), ("head", model.head)]


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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a model name, e.g. vit_small_patch16_224")
    ap.add_argument("--img-size", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--num-classes", type=int, default=None)
    args = ap.parse_args(argv)
    overrides = {k: v for k, v in (("img_size", args.img_size), ("num_classes", args.num_classes)) if v}
    try:
        model = create_model(args.model, **overrides).eval()
    except (ValueError, TypeError) as e:
        raise SystemExit(f"error: {e}") from None
    h, w = model.patch_embed.img_size
    x = torch.randn(args.batch_size, model.patch_embed.proj.in_channels, h, w)
    print(f"{args.model}: patch {model.patch_embed.patch_size}, grid {model.patch_embed.grid_size}, "
          f"{model.num_prefix_tokens + model.patch_embed.num_patches} tokens of width {model.embed_dim}")
    print(format_summary(summarize(model, x)))


if __name__ == "__main__":
    main()
