"""The position-wise feed-forward network (Vaswani et al., 2017, eq. 2) and its gated variant.

`Mlp` is ViT's FFN: Linear(D -> 4D), GELU (erf form), Linear(4D -> D), named `fc1`/`fc2` as in timm.
`SwiGLU` (Shazeer, 2020, "GLU Variants Improve Transformer") gates the hidden layer:
    FFN(x) = W2 (SiLU(x W_g) * (x W_x))
with timm's parameter names (`fc1_g`, `fc1_x`, `fc2`); `GluMlp` is the same gate with both input projections
packed in one `fc1` (timm's `SwiGLUPacked`: DINOv2-giant, EVA02 tiny / small). Each may normalise its hidden
layer before `fc2` (`norm_layer`: `mlp.norm`, NormFormer's extra norm in EVA02 and BEiT-3). `MLP_LAYERS` maps
the names a model option takes (`mlp_layer="gelu"|"swiglu"|"swiglu_packed"|"gelu_tanh"|"quick_gelu"`) to these
classes, as norm.py's `NORM_LAYERS` does for norms. `GeGluMlp` is ViTamin's GeGLU (Chen et al., 2024), a LayerNorm
first, then W2 (GELU(x W0) * (x W1)) (timm's names `norm`, `w0`, `w1`, `w2`; option name "geglu").
The last two are `Mlp` with the activations pretrained text models use: GELU's tanh approximation (Hendrycks &
Gimpel, 2016; BERT's and GPT-2's "gelu_new") and CLIP's quick GELU, x * sigmoid(1.702 x) (Radford et al., 2021),
which are 1e-3 and 2e-2 away from the erf form: enough to move a 12-layer model's outputs visibly.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

__all__ = ["MLP_LAYERS", "GELUTanh", "GeGluMlp", "GluMlp", "Mlp", "QuickGELU", "SwiGLU", "get_mlp_layer"]


class GELUTanh(nn.GELU):
    """GELU's tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (Hugging Face's "gelu_new")."""

    def __init__(self) -> None:
        super().__init__(approximate="tanh")


class QuickGELU(nn.Module):
    """CLIP's activation x * sigmoid(1.702 x) (Hugging Face's "quick_gelu")."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class Mlp(nn.Module):
    """ViT's feed-forward network: (..., D) -> (..., D) through a hidden width `hidden_features` (4D in ViT),
    fc2(norm(drop(act(fc1(x))))) with GELU (erf form) by default; `act_layer` may be any activation class, and
    the hidden norm is there only with `norm_layer`."""

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        act_layer: type[nn.Module] = nn.GELU,
        drop: float = 0.0,
        bias: bool = True,
        norm_layer: Callable[[int], nn.Module] | None = None,
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features, bias=bias)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.norm = norm_layer(hidden_features) if norm_layer is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden_features, in_features, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> (B, N, D)
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))


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
        norm_layer: Callable[[int], nn.Module] | None = None,
    ) -> None:
        super().__init__()
        self.fc1_g = nn.Linear(in_features, hidden_features, bias=bias)
        self.fc1_x = nn.Linear(in_features, hidden_features, bias=bias)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.norm = norm_layer(hidden_features) if norm_layer is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden_features, in_features, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> (B, N, D)
        x = self.act(self.fc1_g(x)) * self.fc1_x(x)
        return self.drop2(self.fc2(self.norm(self.drop1(x))))


class GluMlp(nn.Module):
    """SwiGLU with its gate and value projections packed in one `fc1` (D -> 2 * `hidden_features`, gate first,
    value second): fc2(norm(SiLU(g) * v)) with [g | v] = fc1(x). `hidden_features` is each half's width, as in
    `SwiGLU` (Eva's convention); timm's `GluMlp` / `SwiGLUPacked` counts both halves, so timm's ViT entries with
    `SwiGLUPacked` (DINOv2-giant) give half their mlp_ratio here."""

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        act_layer: type[nn.Module] = nn.SiLU,
        drop: float = 0.0,
        bias: bool = True,
        norm_layer: Callable[[int], nn.Module] | None = None,
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, 2 * hidden_features, bias=bias)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.norm = norm_layer(hidden_features) if norm_layer is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden_features, in_features, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> (B, N, D)
        gate, value = self.fc1(x).chunk(2, dim=-1)  # (B, N, hidden) each
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(gate) * value))))


class GeGluMlp(nn.Module):
    """ViTamin's gated FFN: (..., D) -> (..., D), w2(GELU(w0(n)) * w1(n)) with n = LayerNorm(x) (eps 1e-6): the block
    normalises before the FFN and the FFN normalises again, as timm's vitamin GeGluMlp."""

    def __init__(self, in_features: int, hidden_features: int, drop: float = 0.0, bias: bool = True,
                 norm_layer: Callable[[int], nn.Module] | None = None) -> None:
        super().__init__()
        if norm_layer is not None:
            raise ValueError("the GeGLU MLP normalises its input already; it takes no norm on its hidden layer "
                             "(drop scale_mlp_norm).")
        self.norm = nn.LayerNorm(in_features, eps=1e-6)
        self.w0 = nn.Linear(in_features, hidden_features, bias=bias)
        self.act = nn.GELU()
        self.w1 = nn.Linear(in_features, hidden_features, bias=bias)
        self.drop1 = nn.Dropout(drop)
        self.w2 = nn.Linear(hidden_features, in_features, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> (B, N, D)
        x = self.norm(x)
        return self.drop2(self.w2(self.drop1(self.act(self.w0(x)) * self.w1(x))))


MLP_LAYERS: dict[str, Callable[..., nn.Module]] = {
    "gelu": Mlp,
    "swiglu": SwiGLU,
    "swiglu_packed": GluMlp,
    "geglu": GeGluMlp,
    "gelu_tanh": partial(Mlp, act_layer=GELUTanh),
    "quick_gelu": partial(Mlp, act_layer=QuickGELU),
}


def get_mlp_layer(name: str) -> Callable[..., nn.Module]:
    """The FFN constructor for a model option `mlp_layer` (a key of MLP_LAYERS); an unknown name is a ValueError."""
    try:
        return MLP_LAYERS[name]
    except KeyError:
        raise ValueError(f"unknown mlp_layer {name!r}; choose one of {sorted(MLP_LAYERS)}.") from None
