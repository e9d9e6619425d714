"""Normalization layers: LayerNorm (Ba et al., 2016) and RMSNorm (Zhang & Sennrich, 2019).

LayerNorm centres and scales each token over its D features; RMSNorm only rescales by the root mean square,
which is cheaper and is what modern pre-norm LLM blocks use. Both use eps=1e-6 as timm's ViT does.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["NORM_LAYERS", "LayerNorm2d", "get_norm_layer"]

NORM_LAYERS = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm}


def get_norm_layer(name: str, eps: float = 1e-6):
    """Return a constructor `norm(dim) -> nn.Module` for a norm named 'layernorm' or 'rmsnorm'."""
    if name not in NORM_LAYERS:
        raise ValueError(f"unknown norm_layer {name!r}; choose one of {sorted(NORM_LAYERS)}.")
    return partial(NORM_LAYERS[name], eps=eps)


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of maps (B, C, h, w), at every position (timm's LayerNorm2d: SAM's neck)."""

    def __init__(self, num_channels: int, eps: float = 1e-6) -> None:
        super().__init__(num_channels, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)
