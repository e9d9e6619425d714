"""Training only part of a model: LoRA (Hu et al., 2021) on the attention and MLP projections through `peft`.

A frozen Linear W (out, in) gains a low-rank update trained in its place:

    h = W x + (alpha / r) * B A x        A (r, in), B (out, r), B = 0 at the start (the model is unchanged)

The head is trained in full (its classes are new). A checkpoint never holds an adapter: `merged_state_dict`
folds B A into W (W' = W + (alpha / r) B A) under the plain model's names, so the checkpoint, ONNX and INT8 exports
are a plain ViT; `model.freeze` (VisionTransformer.set_freeze) trains the head alone.

    add_lora(model, rank=8)                     # the trainable share: trainable_share(model), at most a few %
    weights = merged_state_dict(model)          # timm's names and shapes, loadable by create_model's model
"""

from __future__ import annotations

import re

import torch
from torch import nn

from ..models.model_size import check_size, entries, shown_size

__all__ = ["LORA_TARGETS", "add_lora", "has_lora", "merged_state_dict", "trainable_share"]

# every block's attention (fused qkv, output proj) and MLP (fc1, fc2); patch_embed.proj and the head are not adapted
LORA_TARGETS = r".*blocks\.\d+\.(attn\.(qkv|proj)|mlp\.(fc1|fc2))"


def add_lora(model: nn.Module, rank: int = 8, alpha: float | None = None, dropout: float = 0.0,
             targets: str = LORA_TARGETS) -> nn.Module:
    """Inject LoRA adapters of rank `rank` (scale alpha / rank; alpha None: rank, a scale of 1) into `model` in
    place, freeze everything else except the head, and return it. Needs `pip install peft`."""
    if rank < 1:
        raise ValueError(f"a LoRA rank must be at least 1, got {rank}; set optim.lora_rank to 8, say, or 0 for none.")
    adapted = [m for name, m in model.named_modules() if isinstance(m, nn.Linear) and re.fullmatch(targets, name)]
    added = rank * sum(m.in_features + m.out_features for m in adapted)  # A (r, in) and B (out, r) per layer
    check_size(entries(model) + added, f"the model with LoRA adapters of rank {rank}",
               f"{shown_size(added)} of them in the adapters of {len(adapted)} layers",
               "set optim.lora_rank (few_shot.py: --lora-rank) to 8, say")
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError:
        raise ValueError("LoRA needs the peft package: pip install 'vit[peft]' (or pip install peft).") from None
    cfg = LoraConfig(r=rank, lora_alpha=rank if alpha is None else alpha, lora_dropout=dropout,
                     target_modules=targets, bias="none")
    inject_adapter_in_model(cfg, model)  # marks only the adapters trainable
    for p in model.get_classifier().parameters():
        p.requires_grad_(True)
    # the [CLS]-only last block reads qkv.weight directly (VisionTransformer._first_queries), past the adapter
    model.prune_last_block = False
    return model


def has_lora(model: nn.Module) -> bool:
    return any(".lora_A." in name for name, _ in model.named_parameters())


@torch.no_grad()
def merged_state_dict(model: nn.Module, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The plain model's weights: `state` (default: model.state_dict(); e.g. an EMA's or a gathered copy with
    the same names) with each adapted layer's base weight W replaced by W + scaling * B A (computed in float64,
    stored in W's dtype) under the layer's own name, and no adapter tensors. A model without LoRA: `state`."""
    from peft.tuners.lora import LoraLayer

    state = dict(model.state_dict() if state is None else state)
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        for adapter in module.lora_A:
            a = state.pop(f"{name}.lora_A.{adapter}.weight").double()  # (r, in)
            b = state.pop(f"{name}.lora_B.{adapter}.weight").double()  # (out, r)
            w = state[f"{name}.base_layer.weight"]
            state[f"{name}.base_layer.weight"] = (w.double() + module.scaling[adapter] * (b @ a)).to(w.dtype)
        for key in [k for k in state if k.startswith(f"{name}.base_layer.")]:
            state[name + "." + key[len(f"{name}.base_layer."):]] = state.pop(key)
    return state


def trainable_share(model: nn.Module) -> tuple[int, int]:
    """(trainable parameters, all parameters), the adapters counted in both."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
