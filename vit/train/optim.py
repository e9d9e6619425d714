"""Optimizer parameter groups and the learning-rate schedule.

AdamW (Loshchilov & Hutter, 2019) built by timm's optimizer factory (`timm.optim.create_optimizer_v2`), as timm's
train.py does: no weight decay on 1-D parameters (norms, biases) and on `model.no_weight_decay()` (position
embeddings, [CLS]), as DeiT; with `layer_decay`, layer-wise learning-rate decay (BEiT, Bao et al., 2022) over the
layers of `model.group_matcher()`: block i of L gets lr * decay^(L - i), the embeddings decay^(L + 1), the head
the full lr. One difference from the BEiT recipe: timm's ViT grouping puts the final
norm with the last block (decay^1) where BEiT gives it the full lr; ViT-B fine-tuning recipes use timm's.
The schedule is a pure function of the optimizer step: linear warmup, then cosine to `min_lr`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from ..config import OptimConfig

__all__ = ["param_groups", "build_optimizer", "lr_at", "set_lr"]


def param_groups(model: nn.Module, weight_decay: float, layer_decay: float | None = None) -> list[dict]:
    """timm's parameter groups (those `build_optimizer` uses), each with its `weight_decay`, its `lr_scale`
    (1.0 without layer decay) and, for tests and logs, the `names` of its parameters."""
    from timm.optim import param_groups_layer_decay, param_groups_weight_decay

    skip = tuple(getattr(model, "no_weight_decay", lambda: ())())
    if layer_decay:
        groups = param_groups_layer_decay(model, weight_decay, no_weight_decay_list=skip, layer_decay=layer_decay)
    else:
        groups = param_groups_weight_decay(model, weight_decay, no_weight_decay_list=skip)
        groups = [dict(g, lr_scale=1.0) for g in groups]
    names = {id(p): n for n, p in model.named_parameters()}
    for g in groups:
        g["names"] = [names[id(p)] for p in g["params"]]
    return groups


def build_optimizer(model: nn.Module, cfg: OptimConfig, extras: Iterable[nn.Module] = ()) -> torch.optim.Optimizer:
    """AdamW through timm's optimizer factory (`create_optimizer_v2`): weight decay on matrices only (not on
    norms, biases, positions or [CLS]); with `cfg.layer_decay` each group carries lr_scale =
    layer_decay**(depth + 1 - layer), layer 0 the embeddings and depth + 1 the head (BEiT's layer-wise decay),
    which `set_lr` applies. lr and betas from `cfg`; the fused kernel where the device has one. `extras`: a
    task's extra modules (vit/train/tasks/base.py), added as groups of their own at the full lr (no layer decay)."""
    from timm.optim import create_optimizer_v2

    device = next(model.parameters()).device
    kwargs = dict(opt="adamw", lr=cfg.lr, weight_decay=cfg.weight_decay, layer_decay=cfg.layer_decay,
                  betas=tuple(cfg.betas))
    # The fused kernel updates all parameters in one pass (CPU and CUDA); foreach is the fallback.
    try:
        optimizer = create_optimizer_v2(model, fused=device.type in ("cpu", "cuda"), **kwargs)
    except (RuntimeError, TypeError):
        optimizer = create_optimizer_v2(model, foreach=True, **kwargs)
    for module in extras:
        for group in param_groups(module, cfg.weight_decay):
            group.pop("names")
            optimizer.add_param_group(group)
    return optimizer


def lr_at(step: int, total_steps: int, warmup_steps: int, base_lr: float, min_lr: float) -> float:
    """Learning rate at optimizer step `step` (0-based): linear warmup to base_lr, then cosine to min_lr."""
    if warmup_steps and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    t = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + 0.5 * (base_lr - min_lr) * (1 + math.cos(math.pi * min(1.0, t)))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)
