"""Hybrid patch embedding (Dosovitskiy et al., 2021, section 3.1 "Hybrid Architecture"): a convolutional stem turns
the image into a feature map, whose cells (or P x P groups of cells) become the tokens.

    image (B, C, H, W) -> backbone -> (B, F, H / r, W / r) -> proj (kernel = stride = P) -> (B, h*w, D)

r is the stem's stride and h = H / (r P). The stems are timm's own modules, built as timm's entry points build them
(so their parameters, names and numbers are timm's by construction), under timm's names `patch_embed.backbone.*`
and `patch_embed.proj.*`:

    'resnetv2'  BiT's ResNetV2 (Kolesnikov et al., 2020) with weight-standardised 'same'-padded convolutions, no
                pre-activation: R50 (layers 3, 4, 9: r = 16; 3, 4, 6, 3: r = 32), R26 (2, 2, 2, 2: r = 32), or
                the stem alone (layers (): r = 4); vit_*_r*_s*.
    'mci'       MobileCLIP's (Vasu et al., 2024) three-convolution stem, r = 16, no projection (its last
                convolution is D wide); vit_base_mci_224.
    'vitamin'   ViTamin's (Chen et al., 2024) MBConv stages with LayerNorm2d, r = 16, no projection; vitamin_*.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from ..config import (  # the options object lives in vit.config (torch-free), so that a config holds it
    Stem,
    options_from,
)
from .patch_embed import PatchEmbed, to_2tuple

__all__ = ["HybridEmbed", "Stem", "patch_embedding"]

def _backbone(stem: Stem, in_chans: int, embed_dim: int) -> tuple[nn.Module, int]:
    """timm's module for `stem` and its output channels, as timm's hybrid entry points build it."""
    if stem.kind == "resnetv2":  # timm's vision_transformer_hybrid._resnetv2 (padding_same=True)
        from timm.layers import StdConv2dSame
        from timm.models.resnetv2 import ResNetV2, create_resnetv2_stem

        conv = partial(StdConv2dSame, eps=1e-8)
        if not stem.layers:
            return create_resnetv2_stem(in_chans, stem_type="same", preact=False, conv_layer=conv), 64
        net = ResNetV2(layers=stem.layers, num_classes=0, global_pool="", in_chans=in_chans, preact=False,
                       stem_type="same", conv_layer=conv)
        return net, net.num_features
    if stem.kind == "mci":  # timm's vit_base_mci_224
        from timm.models.vision_transformer_hybrid import ConvStem

        return ConvStem(in_chans=in_chans, channels=(embed_dim // 4, embed_dim // 4, embed_dim), stride=(4, 2, 2),
                        kernel_size=(4, 2, 2), padding=0, act_layer=nn.GELU), embed_dim
    from timm.models.vitamin import MbConvStages, VitCfg, VitConvCfg  # timm's vitamin_* entry points

    cfg = VitCfg(embed_dim=(*stem.widths, embed_dim), depths=(2, 4, 1), stem_width=stem.widths[0],
                 conv_cfg=VitConvCfg(norm_layer="layernorm2d", norm_eps=1e-6), head_type="1d")
    return MbConvStages(cfg=cfg, in_chans=in_chans), embed_dim


class HybridEmbed(nn.Module):
    """Images (B, C, H, W) -> tokens (B, h*w, D) through a convolutional stem (`backbone`, stride r) and `proj`
    (kernel = stride = P over the features, or nothing when the stem ends at D). The same interface as PatchEmbed
    (`img_size`, `patch_size`, `grid_size`, `num_patches`, `dynamic_grid`, `set_input_size`)."""

    def __init__(self, stem: Stem, img_size: int | tuple[int, int] = 224, patch_size: int | tuple[int, int] = 1,
                 in_chans: int = 3, embed_dim: int = 768, bias: bool = True) -> None:
        super().__init__()
        self.stem = stem
        self.backbone, features = _backbone(stem, in_chans, embed_dim)
        self.patch_size = to_2tuple(patch_size)
        if not stem.projects and self.patch_size != (1, 1):
            raise ValueError(f"a {stem.kind} stem ends at the token width, so each feature cell is a token; "
                             f"build it with patch_size=1, not {patch_size}.")
        self.proj = nn.Conv2d(features, embed_dim, self.patch_size, stride=self.patch_size, bias=bias) \
            if stem.projects else nn.Identity()
        self.set_input_size(img_size)

    @property
    def reduction(self) -> int:
        """Input pixels per token along the longer side: the stem's stride times the patch size (timm's
        feat_ratio())."""
        return self.stem.stride * max(self.patch_size)

    @property
    def token_step(self) -> tuple[int, int]:
        """Input pixels per token along each side (h, w): the stem's stride times the patch size."""
        return self.stem.stride * self.patch_size[0], self.stem.stride * self.patch_size[1]

    def dynamic_grid(self, height: int, width: int) -> tuple[int, int]:
        """The token grid (h, w) of an input of the given size; raises unless the stem's stride times the patch
        size divides it."""
        step = self.token_step
        if height % step[0] or width % step[1]:
            raise ValueError(f"input of size {height}x{width} is not divisible by {step[0]}x{step[1]} (the "
                             f"{self.stem.kind} stem's stride {self.stem.stride} times the patch size); resize or "
                             "crop it to a multiple.")
        return height // step[0], width // step[1]

    def set_input_size(self, img_size: int | tuple[int, int] | None = None,
                       patch_size: int | tuple[int, int] | None = None) -> None:
        """Another input size, in place (the stem is convolutional: nothing to resample). A hybrid keeps its
        patch size."""
        if patch_size is not None and to_2tuple(patch_size) != self.patch_size:
            raise ValueError("a hybrid model's patch size groups the stem's feature cells and cannot change; build "
                             "another model for another patch size.")
        self.img_size = self.img_size if img_size is None else to_2tuple(img_size)
        self.grid_size = self.dynamic_grid(*self.img_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, C, H, W) -> (B, F, H / r, W / r) -> (B, D, h, w) -> (B, h*w, D), row-major as PatchEmbed
        return self.proj(self.backbone(x)).flatten(2).transpose(1, 2)


def patch_embedding(stem: Stem | dict | None, img_size: int | tuple[int, int], patch_size: int | tuple[int, int],
                    in_chans: int, embed_dim: int, bias: bool = True,
                    norm_layer: Callable[[int], nn.Module] | None = None) -> PatchEmbed | HybridEmbed:
    """The model's `patch_embed`: linear patches (PatchEmbed) without a stem, else HybridEmbed. `norm_layer`
    normalises the patch tokens (AIMv2); a stem takes none."""
    if stem is None:
        return PatchEmbed(img_size, patch_size, in_chans, embed_dim, bias=bias, norm_layer=norm_layer)
    if norm_layer is not None:
        raise ValueError("a convolutional stem takes no norm on its patch tokens; drop embed_norm or the stem.")
    stem = options_from(Stem, stem)
    return HybridEmbed(stem, img_size, patch_size, in_chans, embed_dim, bias=bias)
