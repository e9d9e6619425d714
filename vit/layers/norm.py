"""Normalization layers: LayerNorm (Ba et al., 2016) and RMSNorm (Zhang & Sennrich, 2019).

LayerNorm centres and scales each token over its D features; RMSNorm only rescales by the root mean square,
which is cheaper and is what modern pre-norm LLM blocks use. Both use eps=1e-6 as timm's ViT does.
"""

from __future__ import annotations

from functools import partial

from torch import nn

__all__ = ["NORM_LAYERS", "get_norm_layer"]

NORM_LAYERS = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm}


def get_norm_layer(name: str, eps: float = 1e-6):
    """Return a constructor `norm(dim) -> nn.Module` for a norm named 'layernorm' or 'rmsnorm'."""
    if name not in NORM_LAYERS:
        raise ValueError(f"unknown norm_layer {name!r}; choose one of {sorted(NORM_LAYERS)}.")
    return partial(NORM_LAYERS[name], eps=eps)
