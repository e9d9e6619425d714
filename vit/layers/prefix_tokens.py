"""Prefix tokens: the learned tokens a ViT puts before its patch tokens, chosen by one frozen options object.

    [CLS]          class_token   Dosovitskiy et al. (2021), eq. 1: the token the head reads
    [DIST]         dist_token    DeiT (Touvron et al., 2021, section 5): a second head, distilled from a teacher
    [REG] x k      reg_tokens    "Vision Transformers Need Registers" (Darcet et al., 2024): scratch space
                                 that keeps high-norm outliers off the patch tokens (DINOv2-reg4, SBB)

The sequence is [CLS] [DIST] [REG]... patches (timm's order). With `no_embed_class` (DeiT III, big_vision) the
position table covers the patches only and prefix tokens get none; otherwise it has one row per prefix token.
The model holds the parameters under timm's names (`cls_token`, `dist_token`, `reg_token`) so timm weights load.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PrefixTokens"]


@dataclass(frozen=True)
class PrefixTokens:
    """Which prefix tokens a ViT has (timm's keyword names), validated once here."""

    class_token: bool = True  # one [CLS] token, first
    reg_tokens: int = 0  # register tokens, after [CLS] (and [DIST])
    dist_token: bool = False  # DeiT's distillation token, second; its head `head_dist` is averaged at inference
    no_embed_class: bool = False  # prefix tokens get no position embedding (DeiT III)

    def __post_init__(self) -> None:
        for name in ("class_token", "dist_token", "no_embed_class"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be true or false, got {getattr(self, name)!r}.")
        if isinstance(self.reg_tokens, bool) or not isinstance(self.reg_tokens, int) or self.reg_tokens < 0:
            raise ValueError(f"reg_tokens must be a whole number >= 0 (DINOv2 uses 4), got {self.reg_tokens!r}.")
        if self.dist_token and not self.class_token:
            raise ValueError("dist_token=True needs class_token=True: DeiT's heads read [CLS] and [DIST] together.")

    @property
    def count(self) -> int:
        """Tokens before the patches (timm's `num_prefix_tokens`)."""
        return int(self.class_token) + int(self.dist_token) + self.reg_tokens

    @property
    def embedded(self) -> int:
        """Rows of the position table that belong to prefix tokens: 0 with `no_embed_class`."""
        return 0 if self.no_embed_class else self.count
