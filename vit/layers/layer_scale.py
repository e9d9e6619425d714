"""LayerScale (Touvron et al., 2021, "Going deeper with Image Transformers" (CaiT), section 2.1).

Each residual branch is multiplied by a learned per-channel vector `gamma` initialised small (e.g. 1e-5), so a
deep stack starts close to the identity and each block's contribution grows as training needs it:
    x = x + diag(gamma) . Branch(x)
The parameter is named `gamma` (in the block: `ls1.gamma`, `ls2.gamma`) as in timm, so timm weights load.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LayerScale"]


class LayerScale(nn.Module):
    """Per-channel scaling of a residual branch: (..., D) -> (..., D), x * gamma with gamma (D,) learned,
    initialised to `init_values`. A block without LayerScale uses nn.Identity() in its place."""

    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma
