"""The position-wise feed-forward network (Vaswani et al., 2017, eq. 2) and its gated variant.

`Mlp` is ViT's FFN: Linear(D -> 4D), GELU (erf form), Linear(4D -> D), named `fc1`/`fc2` as in timm.
`SwiGLU` (Shazeer, 2020, "GLU Variants Improve Transformer") gates the hidden layer:
    FFN(x) = W2 (SiLU(x W_g) * (x W_x))
with timm's parameter names (`fc1_g`, `fc1_x`, `fc2`). `MLP_LAYERS` maps the names a model option takes
(`mlp_layer="gelu"|"swiglu"`) to these classes, as norm.py's `NORM_LAYERS` does for norms.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["MLP_LAYERS", "Mlp", "SwiGLU", "get_mlp_layer"]


class Mlp(nn.Module):
    """ViT's feed-forward network: (..., D) -> (..., D) through a hidden width `hidden_features` (4D in ViT),
    fc2(drop(act(fc1(x)))) with GELU (erf form) by default; `act_layer` may be any activation class."""

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
    """The gated FFN: (..., D) -> (..., D), fc2(SiLU(fc1_g(x)) * fc1_x(x)) with two input projections of width
    `hidden_features` (one gate, one value). With hidden = 4D it has 1.5x the parameters of `Mlp`; LLaMA-style
    models shrink hidden to 8D/3 to match."""

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


MLP_LAYERS: dict[str, type[nn.Module]] = {"gelu": Mlp, "swiglu": SwiGLU}


def get_mlp_layer(name: str) -> type[nn.Module]:
    """The FFN class for a model option `mlp_layer` ('gelu' or 'swiglu'); an unknown name is a ValueError."""
    try:
        return MLP_LAYERS[name]
    except KeyError:
        raise ValueError(f"unknown mlp_layer {name!r}; choose one of {sorted(MLP_LAYERS)}.") from None
