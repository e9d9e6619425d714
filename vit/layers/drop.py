"""Stochastic depth (Huang et al., 2016, "Deep Networks with Stochastic Depth").

DropPath zeroes a whole residual branch for a random subset of samples during training and rescales the rest
by 1/keep, so the expected output is unchanged. (LayerScale, the other per-branch operation: layer_scale.py.)
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DropPath"]


class DropPath(nn.Module):
    """Drop a residual branch per sample: (B, ...) -> (B, ...), each sample's branch zeroed with probability
    `drop_prob` while training and the rest scaled by 1/(1 - drop_prob); the identity in eval mode."""

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1.0 - self.drop_prob
        # One Bernoulli draw per sample, broadcast over all other dimensions.
        shape = (x.shape[0],) + (1,) * (x.dim() - 1)
        return x * x.new_empty(shape).bernoulli_(keep).div_(keep)

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}"
