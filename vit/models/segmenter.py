"""A segmentation model: any backbone `create_model` builds, its patch grids from `forward_intermediates`, and a
head from vit/layers/seg_heads.py; logits resized to the input (bilinear), so a pixel's class is an argmax.

    model = create_segmenter(create_model("vit_small_patch16_224"), num_classes=4, head="dpt")
    logits = model(images)  # (B, 4, H, W)

Which blocks feed the head (`seg_blocks`): the linear head takes the last block (DINOv2's "linear") or the last
four concatenated ("linear4"/ multi-layer, `blocks=4`), normalised by the backbone's final norm as DINOv2's
`get_intermediate_layers(norm=True)`; DPT takes four blocks spread over the depth (a 12-block ViT: 2, 5, 8, 11,
transformers' `backbone_out_indices`), before the final norm.

A NaFlex backbone (data.naflex) takes a batch dict of patches with each image's own grid: the head runs on each
image's grid and the model returns a list of logits (C, h_i P, w_i P), the pixels of that grid. The linear head is
per patch, so it runs once on every image's patches in a row (BatchNorm's statistics over all of them, as over a
batch of one size); DPT's neck runs on each image's grid alone (a padded batch of grids would put padding into the
border convolutions) and its classifier's BatchNorm over all the images' pixels at once (`DPTHead.forward_many`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.seg_heads import SEG_HEADS, DPTHead, LinearSegHead

__all__ = ["Segmenter", "create_segmenter", "seg_blocks", "build_segmenter", "is_segmentation"]


def seg_blocks(depth: int, head: str, blocks: int | None = None) -> list[int]:
    """The block indices the head reads: linear: the last `blocks` (1 by default); dpt: four spread evenly, the
    last block last."""
    if head == "dpt":
        if depth < 4:
            raise ValueError(f"a DPT head reads four blocks, and this backbone has {depth}; use a deeper backbone or "
                             "the linear head.")
        return [depth * (k + 1) // 4 - 1 for k in range(4)]
    n = blocks or 1
    if not 1 <= n <= depth:
        raise ValueError(f"a linear head reads 1..{depth} blocks of this backbone, not {n}.")
    return list(range(depth - n, depth))


class Segmenter(nn.Module):
    """backbone -> its blocks `indices` as (maps, prefix) -> `head` -> logits resized to the input.
    `norm`: the backbone's final norm on the block outputs (the linear protocol) or not (DPT)."""

    def __init__(self, backbone: nn.Module, head: nn.Module, indices: list[int], norm: bool) -> None:
        super().__init__()
        self.backbone, self.head, self.indices, self.norm = backbone, head, list(indices), norm
        # what the patch grids never pass through gets no gradient: not trained, so DDP (which waits for a gradient
        # of every trainable parameter) does not stop at the second step; the weights stay in the checkpoint
        for name in ("fc_norm", "attn_pool", "head", "head_drop") + (() if norm else ("norm",)):
            unused = getattr(backbone, name, None)
            if isinstance(unused, nn.Module):
                unused.requires_grad_(False)

    def features(self, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Per block in `indices`: (patch maps (B, D, h, w), prefix tokens (B, P, D) or None)."""
        out = self.backbone.forward_intermediates(x, indices=self.indices, return_prefix_tokens=True, norm=self.norm,
                                                  intermediates_only=True)
        out = [f if isinstance(f, tuple) else (f, None) for f in out]
        if torch.is_tensor(x):  # a NaFlex backbone gives a list of grids even for images of one size: stacked
            out = [(torch.stack(m) if isinstance(m, list) else m, prefix) for m, prefix in out]
        return out

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits at the head's own resolution (B, C, h', w')."""
        return self.head(self.features(x))

    def forward(self, x: torch.Tensor | dict) -> torch.Tensor | list[torch.Tensor]:
        if isinstance(x, dict):
            return self.forward_naflex(x)
        return F.interpolate(self.forward_head(x), size=x.shape[-2:], mode="bilinear", align_corners=False)

    def forward_naflex(self, batch: dict) -> list[torch.Tensor]:
        """A NaFlex batch -> per image its logits (C, h_i P, w_i P) over its own grid's pixels."""
        feats = self.features(batch)  # per block: (B maps (D, h_i, w_i), prefix (B, P, D) or None)
        ph, pw = self.backbone.patch_embed.patch_size
        grids = [m.shape[-2:] for m in feats[0][0]]
        if isinstance(self.head, LinearSegHead):  # per patch: every image's patches in one row, BatchNorm over all
            row = [(torch.cat([m.flatten(1) for m in maps], 1)[None, :, None], None) for maps, _ in feats]
            logits = self.head(row)[0, :, 0].split([h * w for h, w in grids], dim=1)
            logits = [lg.reshape(-1, h, w) for lg, (h, w) in zip(logits, grids)]
        else:  # DPT: each image's grid through the neck alone, the classifier's BatchNorm over all their pixels
            per_image = [[(maps[i][None], None if prefix is None else prefix[i:i + 1]) for maps, prefix in feats]
                         for i in range(len(grids))]
            logits = [lg[0] for lg in self.head.forward_many(per_image)]
        return [F.interpolate(lg[None], size=(h * ph, w * pw), mode="bilinear", align_corners=False)[0]
                for lg, (h, w) in zip(logits, grids)]


def create_segmenter(backbone: nn.Module, num_classes: int, head: str = "linear", blocks: int | None = None,
                     **head_kwargs) -> Segmenter:
    """A Segmenter on `backbone` (its classifier head unused): `head` "linear" (on the last `blocks` blocks) or
    "dpt"; `head_kwargs` go to the head (DPTHead's sizes, width, readout; LinearSegHead's dropout)."""
    if head not in SEG_HEADS:
        raise ValueError(f"unknown segmentation head {head!r}; choose from {', '.join(SEG_HEADS)}.")
    depth, dim = len(backbone.blocks), backbone.embed_dim
    indices = seg_blocks(depth, head, blocks)
    if head == "dpt":
        if getattr(backbone, "num_prefix_tokens", 0) == 0:
            head_kwargs.setdefault("readout", "ignore")  # no [CLS] token to read out
        return Segmenter(backbone, DPTHead(dim, num_classes, **head_kwargs), indices, norm=False)
    return Segmenter(backbone, SEG_HEADS["linear"](dim, num_classes, len(indices), **head_kwargs), indices, norm=True)


def is_segmentation(cfg) -> bool:
    """Whether `cfg` describes a segmentation model (data.dataset: segmentation)."""
    return getattr(cfg.data, "dataset", None) == "segmentation"


def build_segmenter(cfg, num_classes: int, pretrained: bool = False, saved: dict | None = None) -> Segmenter:
    """The Segmenter `cfg` describes: the backbone of cfg.model (no classifier; model.freeze freezes it whole),
    the head of cfg.seg. `pretrained`: the backbone's weights from model.pretrained."""
    from .build import build_model

    backbone = build_model(cfg, 0, pretrained=pretrained, saved=saved)
    s = cfg.seg
    if s.head == "dpt":
        d = backbone.embed_dim
        sizes = tuple(s.dpt_sizes) if s.dpt_sizes else (max(1, d // 8), max(1, d // 4), max(1, d // 2), d)
        kw = dict(sizes=sizes, factors=tuple(s.dpt_factors), width=s.dpt_width)
    else:
        kw = dict(blocks=s.blocks)
    return create_segmenter(backbone, num_classes, s.head, **kw)
