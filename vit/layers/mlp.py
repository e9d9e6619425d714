"""The position-wise feed-forward network (Vaswani et al., 2017, eq. 2) and its gated variant.

`Mlp` is ViT's FFN: Linear(D -> 4D), GELU (erf form), Linear(4D -> D), named `fc1`/`fc2` as in timm.
`SwiGLU` (Shazeer, 2020, "GLU Variants Improve Transformer") gates the hidden layer:
    FFN(x) = W2 (SiLU(x W_g) * (x W_x))
with timm's parameter names (`fc1_g`, `fc1_x`, `fc2`).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Mlp", "SwiGLU"]


class Mlp(nn.Module):
    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        act_layer: type[nn.Module] = nn.GELU,
        drop: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features, bias=bias)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_features, in_features, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> (B, N, D)
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class SwiGLU(nn.Module):
    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        act_layer: type[nn.Module] = nn.SiLU,
        drop: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.fc1_g = nn.Linear(in_features, hidden_features, bias=bias)
        self.fc1_x = nn.Linear(in_features, hidden_features, bias=bias)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_features, in_features, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> (B, N, D)
        x = self.act(self.fc1_g(x)) * self.fc1_x(x)
        return self.drop2(self.fc2(self.drop1(x)))
