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

from typing import Any

from torch import nn

__all__ = ["feature_take_indices", "features_only_model", "FEATURE_CLASSES"]

# timm's `feature_cls` names; a ViT has forward_intermediates(), so timm builds the getter for it.
FEATURE_CLASSES = ("getter",)


def feature_take_indices(num_blocks: int, indices: int | list[int] | tuple[int, ...] | None = None) -> tuple[list[int], int]:
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
    from timm.models import FeatureGetterNet  # timm's own wrapper: same class, same outputs

    features = FeatureGetterNet(model, out_indices=out_indices)
    # as timm: the feature model's config has no classifier
    cfg = {k: v for k, v in pretrained_cfg.items() if k not in ("num_classes", "classifier", "global_pool")}
    features.pretrained_cfg = features.default_cfg = cfg
    return features
