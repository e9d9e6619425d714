"""Stochastic depth (Huang et al., 2016) and LayerScale (Touvron et al., 2021, CaiT).

DropPath zeroes a whole residual branch for a random subset of samples during training and rescales the rest
by 1/keep, so the expected output is unchanged. LayerScale multiplies a branch by a learned per-channel
vector initialised small, which lets deep stacks start close to the identity. Names match timm (`ls1.gamma`).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DropPath", "LayerScale"]


class DropPath(nn.Module):
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


class LayerScale(nn.Module):
    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma
