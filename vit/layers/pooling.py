"""Pooling heads: how the token sequence (B, prefix + N, D) becomes one vector (B, D) for the classifier.

    token   the [CLS] token (Dosovitskiy et al., 2021, eq. 4)
    avg     the mean of the patch tokens ("Better plain ViT baselines", Beyer et al., 2022; SigLIP's gap)
    max     the channel-wise maximum of the patch tokens; avgmax: the mean of the two
    map     multihead attention pooling: one learned query attends to the patch tokens (Lee et al., 2019, "Set
            Transformer"'s PMA; SigLIP / SigLIP2), vit.layers.attention_pool.AttentionPoolLatent
    ''      no pooling: every token

The final norm sits either on every token before pooling (`norm`, ViT) or on the pooled vector (`fc_norm`, timm's
default for the averaging kinds), or nowhere (`final_norm=False`). Pooling reads the patch tokens only, or every
token, prefix included (`pool_include_prefix`; Eva's attention pooling always does). Options are timm's keyword
names.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["POOL_KINDS", "Pooling", "pool_tokens"]

POOL_KINDS = ("token", "avg", "max", "avgmax", "map", "")


@dataclass(frozen=True)
class Pooling:
    """How a ViT pools its tokens and where its final norm is, validated once here."""

    global_pool: str = "token"  # one of POOL_KINDS
    fc_norm: bool | None = None  # norm the pooled vector instead of the tokens; None: for avg / max / avgmax
    final_norm: bool = True  # False: no final norm at all (neither `norm` nor `fc_norm`)
    pool_include_prefix: bool = False  # avg / max / map over the prefix tokens too (Perception Encoder's map)
    attn_pool_num_heads: int | None = None  # 'map': its heads; None: the blocks' (PE: 8)
    attn_pool_mlp_ratio: float | None = None  # 'map': its MLP's ratio; None: the blocks'

    def __post_init__(self) -> None:
        if self.global_pool not in POOL_KINDS:
            raise ValueError(f"unknown global_pool {self.global_pool!r}; choose 'token', 'avg', 'max', 'avgmax', "
                             "'map' (attention pooling) or '' (none).")
        if self.fc_norm is not None and not isinstance(self.fc_norm, bool):
            raise TypeError(f"fc_norm must be true, false or null, got {self.fc_norm!r}.")
        if not isinstance(self.final_norm, bool):
            raise TypeError(f"final_norm must be true or false, got {self.final_norm!r}.")
        if not isinstance(self.pool_include_prefix, bool):
            raise TypeError(f"pool_include_prefix must be true or false, got {self.pool_include_prefix!r}.")
        heads = self.attn_pool_num_heads
        if heads is not None and (isinstance(heads, bool) or not isinstance(heads, int) or heads < 1):
            raise ValueError(f"attn_pool_num_heads must be a whole number >= 1 or null, got {heads!r}.")
        ratio = self.attn_pool_mlp_ratio
        if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio <= 0):
            raise ValueError(f"attn_pool_mlp_ratio must be a number > 0 or null, got {ratio!r}.")

    @property
    def use_fc_norm(self) -> bool:
        """Whether the norm goes after pooling (timm: by default for the averaging kinds)."""
        return self.global_pool in ("avg", "max", "avgmax") if self.fc_norm is None else self.fc_norm

    def check(self, class_token: bool) -> None:
        """Raise if this pooling cannot read the model's tokens."""
        if self.global_pool == "token" and not class_token:
            raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg' or 'map' without it.")


def pool_tokens(x: torch.Tensor, kind: str, num_prefix_tokens: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """(B, prefix + N, D) -> (B, D): [CLS] ('token'), mean / max / both of the patch tokens; '' keeps all.
    timm's `global_pool_nlc`; attention pooling ('map') is a module, not this function. `valid` (B, N): the
    patches that are not NaFlex padding, the only ones averaged or maxed (timm's `global_pool_naflex`)."""
    if kind == "token":
        return x[:, 0]
    if kind == "":
        return x
    x = x[:, num_prefix_tokens:]  # (B, N, D) patch tokens only
    if valid is not None:
        return _masked_pool(x, kind, valid)
    if kind == "avg":
        return x.mean(dim=1)
    if kind == "max":
        return x.amax(dim=1)
    return 0.5 * (x.amax(dim=1) + x.mean(dim=1))  # 'avgmax'


def _masked_pool(x: torch.Tensor, kind: str, valid: torch.Tensor) -> torch.Tensor:
    """Mean / max / both of the valid tokens of x (B, N, D); padding counts nowhere."""
    w = valid.to(x.dtype)[..., None]  # (B, N, 1)
    mean = (x * w).sum(1) / w.sum(1).clamp(min=1)
    if kind == "avg":
        return mean
    top = x.masked_fill(~valid[..., None], float("-inf")).amax(1)  # every image has a valid patch
    return top if kind == "max" else 0.5 * (top + mean)
