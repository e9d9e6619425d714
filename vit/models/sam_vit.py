"""SAM's image encoder (Kirillov et al., 2023, "Segment Anything", section 3 and appendix A; timm's
VisionTransformerSAM): a plain ViT whose blocks attend within 14 x 14 windows except a few global ones, with
decomposed relative positions (vit.layers.windowed_attention), then a convolutional neck to 256 channels.

    tokens = PatchEmbed(x) + pos (h, w, D)                 no [CLS]; positions as an (h, w) table
    tokens = Blocks(tokens)                                the shared Block; windowed or global attention by depth
    features = LN2d(Conv3x3(LN2d(Conv1x1(tokens))))        the neck, (B, 256, h, w): what SAM's decoder reads
    logits = fc(mean_hw(features))                         timm's ClassifierHead (no head on the published tags)

Parameter names are timm's (`pos_embed` (1, h, w, D), `blocks.i.attn.rel_pos_h`, `neck.0` ... `neck.3`, `head.fc`),
so timm's weights load strictly. A fixed-size model (timm resamples positions for other sizes; this one refuses
them in one sentence). `forward_features` and `forward_intermediates` return (B, C, h, w) maps as timm's.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
from torch import nn

from ..config import AttentionOptions
from ..layers import BlockParts, LayerNorm2d, PatchEmbed, Pooling, PrefixTokens, WindowedAttention, get_norm_layer
from .encoder import Encoder
from .features import feature_take_indices
from .vision_transformer import check_img_size
from .vit_api import ModelApi

__all__ = ["SamViT"]


class SamViT(ModelApi, nn.Module):
    """SAM's image encoder: images (B, C, H, W) -> logits (B, num_classes), or the neck's maps (B, neck_chans, h, w)
    from `forward_features`. Blocks in `global_attn_indexes` attend over the whole grid, the others within
    `window_size` x `window_size` windows (padded to whole windows); `use_rel_pos` gives each its decomposed
    relative positions, `use_abs_pos` the (h, w, D) table; `neck_chans` None ends in a LayerNorm2d instead of the
    neck. create_model's options objects arrive too: no prefix tokens, avg / max pooling, no block parts."""

    def __init__(self, img_size: int | tuple[int, int] = 1024, patch_size: int = 16, in_chans: int = 3,
                 num_classes: int = 1000, embed_dim: int = 768, depth: int = 12, num_heads: int = 12,
                 mlp_ratio: float = 4.0, window_size: int = 14, global_attn_indexes: Sequence[int] = (),
                 use_rel_pos: bool = True, use_abs_pos: bool = True, neck_chans: int | None = 256,
                 norm_eps: float = 1e-6, init_values: float | None = None, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, drop_path_rate: float = 0.0,
                 attention: AttentionOptions = AttentionOptions(),  # noqa: B008 (frozen: one shared default is safe)
                 prefix: PrefixTokens = PrefixTokens(class_token=False),  # noqa: B008
                 pooling: Pooling = Pooling(global_pool="avg"),  # noqa: B008
                 parts: BlockParts = BlockParts(), **unused) -> None:  # noqa: B008
        super().__init__()
        if prefix.count or parts != BlockParts() or pooling.global_pool not in ("avg", "max", "") or unused:
            raise ValueError("SAM's encoder (samvit_*) has no prefix tokens, block parts or other options than its "
                             f"own, and pools avg / max; drop {', '.join(sorted(unused)) or 'those options'}.")
        if not isinstance(attention, AttentionOptions):  # one per block (num_kv_heads as a tuple) is not SAM's
            raise ValueError("SAM's encoder takes one AttentionOptions for every block.")
        self.num_classes, self.in_chans, self.global_pool = num_classes, in_chans, pooling.global_pool
        self.embed_dim, self.num_prefix_tokens, self.dynamic_img_size = embed_dim, 0, False
        self._variant, self._pretrained_cfg = None, None
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        grid = self.patch_embed.grid_size
        self.pos_embed = nn.Parameter(torch.zeros(1, *grid, embed_dim)) if use_abs_pos else None
        layers = [partial(WindowedAttention, window_size=0 if i in global_attn_indexes else window_size, grid=grid,
                          use_rel_pos=use_rel_pos) for i in range(depth)]
        self.blocks = Encoder(depth, embed_dim, num_heads, mlp_ratio, True, 0.0, attn_drop_rate,  # bias: in attention
                              drop_path_rate, init_values=init_values, norm_layer=get_norm_layer("layernorm", norm_eps),
                              attention=attention, attn_layer=layers)
        self.feature_info = [dict(module=f"blocks.{i}", num_chs=embed_dim, reduction=patch_size) for i in range(depth)]
        chans = neck_chans or embed_dim
        self.neck = nn.Sequential(nn.Conv2d(embed_dim, chans, 1, bias=False), LayerNorm2d(chans),
                                  nn.Conv2d(chans, chans, 3, padding=1, bias=False), LayerNorm2d(chans)) \
            if neck_chans else LayerNorm2d(embed_dim)
        self.num_features = self.head_hidden_size = chans
        self.head = SamHead(chans, num_classes, drop_rate)

    def _tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Images -> patch tokens (B, h*w, D) with positions."""
        check_img_size(x, self.patch_embed.img_size)
        x = self.patch_embed(x)
        return x if self.pos_embed is None else x + self.pos_embed.flatten(1, 2)

    def _maps(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens (B, h*w, D) -> (B, D, h, w)."""
        h, w = self.patch_embed.grid_size
        return x.transpose(1, 2).reshape(x.shape[0], -1, h, w)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> the neck's maps (B, neck_chans, h, w)."""
        return self.neck(self._maps(self.blocks(self._tokens(x))[0]))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self.head(x, self.global_pool, pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    @torch.jit.unused
    def forward_with_attention(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits and every block's (B, H, N, N) map: a windowed block's holds each token's window, zero elsewhere
        (vit.layers.windowed_attention), so rollout multiplies what each token saw."""
        tokens, maps = self.blocks(self._tokens(x), return_attention=True)
        return self.forward_head(self.neck(self._maps(tokens))), maps

    def forward_intermediates(self, x: torch.Tensor, indices: int | list[int] | tuple[int, ...] | None = None,
                              norm: bool = False, stop_early: bool = False, output_fmt: str = "NCHW",
                              intermediates_only: bool = False) -> list[torch.Tensor] | tuple:
        """Block outputs as (B, D, h, w) maps (the neck applied to each with `norm`, as timm) and the neck's maps
        of the last block: (final, intermediates) or the intermediates only."""
        if output_fmt != "NCHW":
            raise ValueError(f"SAM's encoder gives NCHW maps only (as timm's), got output_fmt {output_fmt!r}.")
        take, last = feature_take_indices(len(self.blocks), indices)
        x, out = self._tokens(x), []
        for i, blk in enumerate(self.blocks):
            if stop_early and i > last:
                break
            x, _ = blk(x)
            if i in take:
                out.append(self.neck(self._maps(x)) if norm else self._maps(x))
        return out if intermediates_only else (self.neck(self._maps(x)), out)


class SamHead(nn.Module):
    """timm's ClassifierHead on maps: (B, C, h, w) -> pooled (B, C) -> dropout -> `fc` (none for 0 classes)."""

    def __init__(self, chans: int, num_classes: int, drop_rate: float = 0.0) -> None:
        super().__init__()
        self.drop = nn.Dropout(drop_rate)
        self.fc = nn.Linear(chans, num_classes) if num_classes > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, pool: str = "avg", pre_logits: bool = False) -> torch.Tensor:
        if pool:
            x = x.mean((2, 3)) if pool == "avg" else x.amax((2, 3))
        x = self.drop(x)
        return x if pre_logits else self.fc(x)
