"""DINO's projection head (Caron et al. 2021, section 3.1; DINOv2's `DINOHead`): an MLP to a bottleneck, L2
normalisation, then a weight-normalised linear layer to K prototypes without bias:

    h = W3 gelu(W2 gelu(W1 x + b1) + b2) + b3          (B, bottleneck)
    z = h / ||h||                                        (B, bottleneck)
    y = (g v / ||v||_row) z                              (B, K), g fixed at 1 (DINO's norm_last_layer)

The last layer is kept as its direction `last_layer.weight_v` (K, bottleneck) and normalised in `forward`: with g
frozen at 1 the row norms carry nothing, so only v is a parameter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["DINOHead", "WeightNormLinear"]


class WeightNormLinear(nn.Module):
    """y = x (v / ||v||_row)^T: a linear layer without bias whose rows have norm 1 (weight_norm with g = 1)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight_v = nn.Parameter(torch.empty(out_features, in_features))
        nn.init.trunc_normal_(self.weight_v, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, F.normalize(self.weight_v, dim=1))


class DINOHead(nn.Module):
    """`in_dim` -> `nlayers` linear layers (GELU between, `hidden_dim` wide) -> `bottleneck_dim` -> L2 -> `out_dim`."""

    def __init__(self, in_dim: int, out_dim: int, hidden_dim: int = 2048, bottleneck_dim: int = 256,
                 nlayers: int = 3) -> None:
        super().__init__()
        dims = [in_dim] + [hidden_dim] * (nlayers - 1) + [bottleneck_dim]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            layers += [nn.Linear(a, b)] + ([nn.GELU()] if i < len(dims) - 2 else [])
        self.mlp = nn.Sequential(*layers)
        for m in self.mlp:
            if isinstance(m, nn.Linear):  # DINO's init: truncated normal, zero bias
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        self.last_layer = WeightNormLinear(bottleneck_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mlp(x)  # (B, bottleneck)
        x = F.normalize(x, dim=-1, eps=1e-6 if x.dtype == torch.float16 else 1e-12)
        return self.last_layer(x)  # (B, K)
