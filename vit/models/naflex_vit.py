"""NaFlexVit: the Vision Transformer on NaFlex inputs (vit.layers.naflex; docs/naflex.md), as timm's `NaFlexVit`
beside its `VisionTransformer`.

A NaFlex batch is a dict of patches (B, N, P*P*C) flattened at each image's own aspect ratio, their (row, column)
coordinates and a validity mask (B, N) for the padding. The model is the square one's parts (encoder, final norm,
pooling, head, timm's API) with three differences, each a method here rather than a branch there:
    embeddings  a Linear on the flattened patches, positions resampled per image (`embeds`, timm's names)
    attention   padding is never a key (a key-padding mask); rotary tables per image
    pooling     padding is left out of averages, maxima and attention pooling (timm's global_pool_naflex)
Images (B, C, H, W) work too: they are patchified whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..config import options_from
from ..layers import NaFlex, NaFlexEmbeds, check_combination, naflex_grids, pool_tokens
from ..layers.naflex import check_batch, key_padding_mask, naflex_rope_table
from .vision_transformer import VisionTransformer

__all__ = ["NaFlexVit"]

Batch = dict[str, torch.Tensor]


class NaFlexVit(VisionTransformer):
    """VisionTransformer's arguments plus `naflex` (vit.layers.NaFlex or its mapping: the position table's grid
    and how it is resampled). No distillation token, no sine-cosine table (vit.layers.combinations)."""

    def __init__(self, *args: Any, naflex: NaFlex | dict | None = None, **kwargs: Any) -> None:
        naflex = options_from(NaFlex, naflex, "naflex") or NaFlex()
        # read by `_embeddings` while the base constructor runs; set before nn.Module.__init__, so not through it
        self.__dict__["naflex"] = naflex
        super().__init__(*args, **kwargs)

    def _embeddings(self, stem, img_size, patch_size, in_chans: int, pos_embed: str, pre_norm: bool,
                    embed_norm: Any) -> None:
        """timm's NaFlexVit embeddings in place of the square ones: the Linear projection, [CLS], registers and
        the position table inside `embeds` (timm's names), `patch_embed` its weightless geometry. The square
        ones are built first, so a seed gives the weights it gave when NaFlex was an option of the square model."""
        super()._embeddings(stem, img_size, patch_size, in_chans, pos_embed, pre_norm, embed_norm)
        check_combination(naflex=True, dist_token=self.prefix.dist_token, sincos=pos_embed == "sincos")
        grid = self.patch_embed
        self.embeds = NaFlexEmbeds(grid.img_size, grid.patch_size, in_chans, self.embed_dim, self.prefix.class_token,
                                   self.prefix.reg_tokens, self.naflex, pos_embed == "learn", not pre_norm)
        self.patch_embed = self.embeds.grid
        self.cls_token = self.dist_token = self.reg_token = self.pos_embed = None

    # --- inputs ---------------------------------------------------------------------------------------------

    @torch.jit.unused
    def naflex_inputs(
        self, x: torch.Tensor | Batch, attn_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, Batch]:
        """A NaFlex batch (images are patchified whole) -> tokens (B, prefix + N, D) with per-image positions,
        the rotary table (B, N, 2d) or None, the attention mask (padding is never a key, unless the caller gives
        one) and the batch."""
        batch = x if isinstance(x, dict) else self.patch_embed(x)
        check_batch(batch, self.embeds.proj.in_features)
        coord, valid = batch["patch_coord"], batch["patch_valid"]
        tokens = self.norm_pre(self.pos_drop(self.embeds(batch["patches"], coord, valid)))
        rope = None if self.rope is None else naflex_rope_table(self.rope, coord, valid)
        mask = key_padding_mask(valid, self.num_prefix_tokens) if attn_mask is None else attn_mask
        return tokens, rope, mask, batch

    @torch.jit.unused
    def intermediate_inputs(self, x: torch.Tensor | Batch, attn_mask: torch.Tensor | None = None) -> tuple[
            torch.Tensor, torch.Tensor | None, torch.Tensor | None, Callable[[torch.Tensor], Any], dict[str, Any]]:
        """forward_intermediates' inputs (vit.models.features): each intermediate (B, N, D) becomes the B images'
        own grids (D, h_i, w_i) for 'NCHW' (where timm refuses), and output_dict adds 'patch_valid'."""
        tokens, rope, mask, batch = self.naflex_inputs(x, attn_mask)
        coord, valid = batch["patch_coord"], batch["patch_valid"]
        return tokens, rope, mask, lambda y: naflex_grids(y, coord, valid), {"patch_valid": valid}

    # --- forward --------------------------------------------------------------------------------------------

    @torch.jit.unused
    def encode(
        self, x: torch.Tensor | Batch, patch_keep: torch.Tensor | None = None, return_attention: bool = False,
        last_queries: int | None = None, attn_mask: torch.Tensor | None = None, is_causal: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Normalized tokens (B, prefix + N, D) of a NaFlex batch and the per-block attention maps."""
        check_combination(naflex=True, patch_keep=patch_keep is not None)
        x, rope, attn_mask, _ = self.naflex_inputs(x, attn_mask)
        x, attentions = self.blocks(x, attn_mask, False, return_attention, last_queries, rope)
        return self.norm(x), attentions

    @torch.jit.unused
    def forward_features(
        self, x: torch.Tensor | Batch, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> torch.Tensor | Batch:
        """As timm's NaFlexVit: a batch dict -> {"patches": normalized tokens (B, prefix + N, D), "patch_valid":
        (B, N)}; images (B, C, H, W) -> tokens."""
        tokens, rope, mask, batch = self.naflex_inputs(x, attn_mask)
        tokens = self.norm(self.blocks(tokens, mask, rope=rope)[0])
        return {"patches": tokens, "patch_valid": batch["patch_valid"]} if isinstance(x, dict) else tokens

    @torch.jit.unused
    def naflex_pool(self, x: torch.Tensor, patch_valid: torch.Tensor) -> torch.Tensor:
        """`pool` with patch_valid (B, N) keeping padding out of the average, the max and attention pooling's keys
        (timm's global_pool_naflex); [CLS] pooling reads [CLS]."""
        if self.attn_pool is not None:
            return self.attn_pool(x[:, self.num_prefix_tokens :], patch_valid)
        return pool_tokens(x, self.global_pool, self.num_prefix_tokens, patch_valid)

    @torch.jit.unused
    def forward_head(
        self, x: torch.Tensor | Batch, pre_logits: bool = False, patch_valid: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Tokens (B, prefix + N, D) with `patch_valid` (B, N), or forward_features' dict -> pooled (B, D) if
        pre_logits, else logits (B, num_classes). Without patch_valid every token is pooled."""
        if isinstance(x, dict):
            x, patch_valid = x["patches"], x["patch_valid"]
        if patch_valid is None:
            return super().forward_head(x, pre_logits)
        return self.classify(self.naflex_pool(x, patch_valid), pre_logits)

    @torch.jit.unused
    def forward(self, x: torch.Tensor | Batch, attn_mask: torch.Tensor | None = None,
                is_causal: bool = False) -> torch.Tensor:
        """Logits (B, num_classes) of a NaFlex batch (or images); every token runs through every block."""
        return self.forward_head(self.forward_features(x, attn_mask))

    @torch.jit.unused
    def forward_with_attention(
        self, x: torch.Tensor | Batch, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits and every block's attention probabilities (B, H, prefix + N, prefix + N), padding included."""
        feats, attentions = self.encode(x, return_attention=True, attn_mask=attn_mask)
        valid = x["patch_valid"] if isinstance(x, dict) else None
        return self.forward_head(feats, patch_valid=valid), attentions

    # --- timm's model API -------------------------------------------------------------------------------------

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """The square model's set, plus the tokens and positions inside `embeds`."""
        names = {f"embeds.{n}" for n in ("pos_embed", "pos_embed_y", "pos_embed_x", "cls_token", "reg_token")}
        return super().no_weight_decay() | (names & {n for n, _ in self.named_parameters()})

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """As timm's NaFlexVit: the projection, tokens and positions are all `embeds`, the stem group."""
        return {**super().group_matcher(coarse), "stem": r"^embeds"}
