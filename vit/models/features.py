"""Intermediate features: which blocks to read, and the `features_only` model, as timm defines them.

A ViT has one feature level per block, all at the patch grid (stride = patch size). Dense heads (segmentation,
detection: ViTDet, DPT, UperNet) read a few of them, conventionally the last ones, as (B, D, h, w) maps:
    indices=None -> every block;  indices=n (int) -> the last n blocks;  indices=[i, j, ...] -> those blocks
    (negative indices count from the end).
`features_only=True` in `vit.create_model` wraps the model in timm's own `FeatureGetterNet` (the class timm
uses for its ViTs), so the feature model, its `feature_info` and its outputs are exactly timm's; the wrapper
prunes the blocks after the last one read, the final norm and the head.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["FeatureIntermediates", "feature_take_indices", "features_only_model", "FEATURE_CLASSES"]

# timm's `feature_cls` names; a ViT has forward_intermediates(), so timm builds the getter for it.
FEATURE_CLASSES = ("getter",)


def feature_take_indices(
    num_blocks: int, indices: int | list[int] | tuple[int, ...] | None = None
) -> tuple[list[int], int]:
    """Absolute block indices to read and the largest one (the last block that must run)."""
    if indices is None:
        indices = num_blocks
    if isinstance(indices, int):
        if not 0 < indices <= num_blocks:
            raise ValueError(f"cannot take the last {indices} of {num_blocks} blocks; use 1 to {num_blocks}.")
        take = [num_blocks - indices + i for i in range(indices)]
    else:
        take: list[int] = []
        for i in indices:
            idx = num_blocks + i if i < 0 else i
            if not 0 <= idx < num_blocks:
                raise ValueError(
                    f"block index {i} is out of range for {num_blocks} blocks; use 0 to {num_blocks - 1} "
                    f"or -{num_blocks} to -1."
                )
            take.append(idx)
        if not take:
            raise ValueError("indices is empty; pass None (every block), n (the last n) or a list of blocks.")
    return take, max(take)


def features_only_model(
    model: nn.Module, pretrained_cfg: dict[str, Any], out_indices: int | list[int] | tuple[int, ...] = 3,
    feature_cls: str = "getter",
) -> nn.Module:
    """Wrap `model` in timm's FeatureGetterNet: forward returns a list of (B, D, h, w) maps, one per index.
    Default: the last 3 blocks, as timm's ViTs."""
    if feature_cls not in FEATURE_CLASSES:
        raise ValueError(
            f"feature_cls {feature_cls!r} is not supported for a ViT; use 'getter' (forward_intermediates)."
        )
    from timm.models._features import FeatureGetterNet  # timm's own wrapper (not re-exported): same class, same outputs

    features = FeatureGetterNet(model, out_indices=out_indices)
    # as timm: the feature model's config has no classifier
    cfg = {k: v for k, v in pretrained_cfg.items() if k not in ("num_classes", "classifier", "global_pool")}
    features.pretrained_cfg = features.default_cfg = cfg
    return features


class FeatureIntermediates:
    """timm's intermediate-feature methods for a ViT. The model provides `blocks` (an Encoder), `_embed` (images ->
    tokens with positions), `norm`, `fc_norm`, `num_prefix_tokens`, `grid_size` and `reset_classifier`; a model of
    another input contract (NaFlexVit) overrides `intermediate_inputs`."""

    @torch.jit.unused
    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | tuple[int, ...] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        output_dict: bool = False,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]] | dict[str, Any]:
        """Block outputs for dense heads. `indices`: None (all), n (last n) or a list (see vit.models.features).
        Each is (B, D, h, w) for output_fmt='NCHW' or (B, h*w, D) for 'NLC', without prefix tokens unless
        `return_prefix_tokens` (then (features, prefix (B, prefix, D)) pairs); `norm` applies the final norm.
        Returns (final normalized tokens, intermediates), only the intermediates, or timm's dict.
        NaFlexVit takes a NaFlex batch (its `intermediate_inputs`): (B, N, D) with the padding for 'NLC', the B
        images' own grids (D, h_i, w_i) for 'NCHW', 'patch_valid' in the dict."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"unknown output_fmt {output_fmt!r}; choose 'NCHW' or 'NLC'.")
        take, max_index = feature_take_indices(len(self.blocks), indices)
        x, rope, attn_mask, to_maps, extra = self.intermediate_inputs(x, attn_mask)
        intermediates = []
        stop = max_index if stop_early else len(self.blocks) - 1
        for i, blk in enumerate(self.blocks):
            if i > stop:
                break
            if self.blocks.grad_checkpointing and self.training:
                x, _ = checkpoint(blk, x, attn_mask, is_causal, False, None, rope, use_reentrant=False)
            else:
                x, _ = blk(x, attn_mask, is_causal, rope=rope)
            if i in take:
                intermediates.append(self.norm(x) if norm else x)  # (B, prefix + h*w, D)
        p = self.num_prefix_tokens
        prefix = [y[:, :p] for y in intermediates]
        intermediates = [y[:, p:] for y in intermediates]
        if output_fmt == "NCHW":
            intermediates = [to_maps(y) for y in intermediates]
        if output_dict:
            out: dict[str, Any] = {"image_intermediates": intermediates, **extra}
            if return_prefix_tokens and p:
                out["image_intermediates_prefix"] = prefix
            if not intermediates_only:
                out["image_features"] = self.norm(x)
            return out
        if return_prefix_tokens and p:
            intermediates = list(zip(intermediates, prefix))
        return intermediates if intermediates_only else (self.norm(x), intermediates)

    @torch.jit.unused
    def intermediate_inputs(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> tuple[
            torch.Tensor, torch.Tensor | None, torch.Tensor | None, Callable[[torch.Tensor], Any], dict[str, Any]]:
        """forward_intermediates' inputs: tokens (B, prefix + h*w, D), the rotary table or None, the mask, how a
        block's patch tokens (B, h*w, D) become maps for 'NCHW' ((B, D, h, w)), and what output_dict adds (nothing
        here; a model of another input contract, NaFlexVit, overrides this)."""
        B, _, height, width = x.shape
        h, w = self.grid_size((height, width))
        rope = self.rope_table(x)
        return self._embed(x), rope, attn_mask, lambda y: y.reshape(B, h, w, -1).permute(0, 3, 1, 2).contiguous(), {}

    @torch.jit.ignore
    def prune_intermediate_layers(
        self, indices: int | list[int] | tuple[int, ...] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the blocks after the last index read (and the final norm, the head) in place; returns the
        absolute indices, which forward_intermediates then takes."""
        take, max_index = feature_take_indices(len(self.blocks), indices)
        del self.blocks[max_index + 1 :]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.fc_norm = nn.Identity()
            self.reset_classifier(0, "")
        return take

    @torch.jit.unused
    def get_intermediate_layers(
        self,
        x: torch.Tensor,
        n: int | list[int] | tuple[int, ...] = 1,
        reshape: bool = False,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        attn_mask: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """DINO's interface: the last n (or the listed) blocks' patch tokens, (B, h*w, D) or (B, D, h, w)."""
        return self.forward_intermediates(x, n, return_prefix_tokens=return_prefix_tokens, norm=norm,
                                          output_fmt="NCHW" if reshape else "NLC", intermediates_only=True,
                                          attn_mask=attn_mask)
