"""Optimizer parameter groups and the learning-rate schedule.

AdamW (Loshchilov & Hutter, 2019) with no weight decay on norms, biases, position embeddings and [CLS]
(`model.no_weight_decay()`), as DeiT and timm do. Optional layer-wise learning-rate decay (BEiT, Bao et al.,
2022): block i of L gets lr * decay^(L + 1 - (i + 1)), embeddings decay^(L + 1), the head the full lr.
The schedule is a pure function of the optimizer step: linear warmup, then cosine to `min_lr`.
"""

from __future__ import annotations

import math
import re

import torch
from torch import nn

from .config import OptimConfig

__all__ = ["param_groups", "build_optimizer", "lr_at", "set_lr"]


def _layer_id(name: str, depth: int) -> int:
    if name.startswith(("cls_token", "pos_embed", "patch_embed", "token_embed")):
        return 0
    m = re.match(r"blocks\.(\d+)\.", name)
    return int(m.group(1)) + 1 if m else depth + 1


def param_groups(model: nn.Module, weight_decay: float, layer_decay: float | None = None) -> list[dict]:
    """Groups keyed by (decay or not, layer); each carries `lr_scale` for the schedule."""
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    depth = len(getattr(model, "blocks", []))
    groups: dict[tuple[bool, int], dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_decay = p.ndim <= 1 or name in skip or name.endswith(".bias")
        layer = _layer_id(name, depth) if layer_decay else 0
        scale = layer_decay ** (depth + 1 - layer) if layer_decay else 1.0
        g = groups.setdefault((no_decay, layer), {
            "params": [], "names": [], "weight_decay": 0.0 if no_decay else weight_decay, "lr_scale": scale,
        })
        g["params"].append(p)
        g["names"].append(name)
    return list(groups.values())


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """AdamW over `param_groups(model, ...)`: weight decay on matrices only (not on norms, biases, positions or
    [CLS]); with `cfg.layer_decay` each group carries lr_scale = layer_decay**(depth + 1 - layer), layer 0 the
    embeddings and depth + 1 the head (BEiT's layer-wise decay), which `set_lr` applies. lr and betas from `cfg`;
    the fused kernel where the device has one."""
    groups = param_groups(model, cfg.weight_decay, cfg.layer_decay)
    for g in groups:
        g.pop("names")
    device = next(model.parameters()).device
    # The fused kernel updates all parameters in one pass (CPU and CUDA); foreach is the fallback.
    try:
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), fused=device.type in ("cpu", "cuda"))
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), foreach=True)


def lr_at(step: int, total_steps: int, warmup_steps: int, base_lr: float, min_lr: float) -> float:
    """Learning rate at optimizer step `step` (0-based): linear warmup to base_lr, then cosine to min_lr."""
    if warmup_steps and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    t = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + 0.5 * (base_lr - min_lr) * (1 + math.cos(math.pi * min(1.0, t)))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)
