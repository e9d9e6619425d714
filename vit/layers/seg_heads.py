"""Segmentation heads on a ViT's patch grids: each takes block outputs as maps (B, D, h, w) with their prefix
tokens, and returns class logits at the head's own resolution (the model resizes them to the input).

- `LinearSegHead`: DINOv2's linear protocol (Oquab et al., 2023, sec. 7.4; its `BNHead`): the maps of one or
  several blocks concatenated on channels, BatchNorm, a 1x1 convolution. Per patch:
      logits[:, :, i, j] = W (BN(concat_k f_k[:, :, i, j])) + b,   W: (C, K*D).
- `DPTHead`: DPT (Ranftl et al., 2021, "Vision Transformers for Dense Prediction"), as transformers'
  `DPTForSemanticSegmentation` builds it: reassemble four blocks' tokens to maps at 4x, 2x, 1x and 1/2x the patch
  grid (readout: the [CLS] token concatenated to each patch token and projected, "project"; or added, "add"; or
  dropped, "ignore"), 3x3 convolutions to one width, fusion from the coarsest map up (pre-activation residual
  units, x2 bilinear, 1x1), then conv-BN-ReLU and a 1x1 classifier, upsampled x2. Parameter names follow
  transformers' (`reassemble_stage.layers.N.projection`, `fusion_stage.layers.N.residual_layer1.convolution1`,
  `head.head.N`) so its weights copy over by name.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LinearSegHead", "DPTHead", "SEG_HEADS"]

Maps = list[tuple[torch.Tensor, torch.Tensor | None]]  # per block: (patch maps (B, D, h, w), prefix (B, P, D) or None)


class LinearSegHead(nn.Module):
    """BN + 1x1 conv on `num_blocks` concatenated maps of width `embed_dim` each (DINOv2's linear head)."""

    def __init__(self, embed_dim: int, num_classes: int, num_blocks: int = 1, dropout: float = 0.0) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(embed_dim * num_blocks)
        self.dropout = nn.Dropout2d(dropout) if dropout else nn.Identity()
        self.conv_seg = nn.Conv2d(embed_dim * num_blocks, num_classes, kernel_size=1)

    def forward(self, feats: Maps) -> torch.Tensor:
        x = torch.cat([f for f, _ in feats], dim=1)  # (B, K*D, h, w)
        return self.conv_seg(self.dropout(self.bn(x)))  # (B, C, h, w)


class _Reassemble(nn.Module):
    """One scale: 1x1 projection to `channels`, then resample by `factor` (4, 2: transposed conv; 1: none; 0.5: a
    stride-2 3x3 conv)."""

    def __init__(self, embed_dim: int, channels: int, factor: float) -> None:
        super().__init__()
        self.projection = nn.Conv2d(embed_dim, channels, kernel_size=1)
        if factor > 1:
            self.resize = nn.ConvTranspose2d(channels, channels, kernel_size=int(factor), stride=int(factor))
        elif factor == 1:
            self.resize = nn.Identity()
        else:
            self.resize = nn.Conv2d(channels, channels, kernel_size=3, stride=int(round(1 / factor)), padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resize(self.projection(x))


class _ReassembleStage(nn.Module):
    def __init__(self, embed_dim: int, sizes: tuple[int, ...], factors: tuple[float, ...], readout: str) -> None:
        super().__init__()
        self.readout = readout
        self.layers = nn.ModuleList(_Reassemble(embed_dim, c, f) for c, f in zip(sizes, factors))
        if readout == "project":  # [patch; cls] (2D) -> D, GELU
            self.readout_projects = nn.ModuleList(nn.Sequential(nn.Linear(2 * embed_dim, embed_dim), nn.GELU())
                                                  for _ in sizes)

    def forward(self, feats: Maps) -> list[torch.Tensor]:
        out = []
        for i, (x, prefix) in enumerate(feats):  # x (B, D, h, w)
            if self.readout != "ignore" and prefix is not None:
                cls = prefix[:, 0]  # (B, D)
                if self.readout == "project":
                    tokens = x.flatten(2).transpose(1, 2)  # (B, h*w, D)
                    tokens = torch.cat([tokens, cls[:, None].expand_as(tokens)], dim=-1)
                    x = self.readout_projects[i](tokens).transpose(1, 2).reshape(x.shape)
                else:  # add
                    x = x + cls[:, :, None, None]
            out.append(self.layers[i](x))
        return out


class _ResidualUnit(nn.Module):
    """Pre-activation residual unit: x + conv(relu(conv(relu(x))))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.convolution1 = nn.Conv2d(width, width, kernel_size=3, padding=1)
        self.convolution2 = nn.Conv2d(width, width, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.convolution2(F.relu(self.convolution1(F.relu(x))))


class _Fusion(nn.Module):
    """(fused so far, this scale's map) -> fused at twice the size: residual unit on the map, added, a second
    residual unit, x2 bilinear (align_corners), 1x1 projection."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.projection = nn.Conv2d(width, width, kernel_size=1)
        self.residual_layer1 = _ResidualUnit(width)
        self.residual_layer2 = _ResidualUnit(width)

    def forward(self, x: torch.Tensor, skip: torch.Tensor | None = None) -> torch.Tensor:
        if skip is not None:
            if skip.shape != x.shape:  # an odd grid: the 1/2x map came back one pixel larger
                skip = F.interpolate(skip, size=x.shape[2:], mode="bilinear", align_corners=False)
            x = x + self.residual_layer1(skip)
        x = F.interpolate(self.residual_layer2(x), scale_factor=2, mode="bilinear", align_corners=True)
        return self.projection(x)


class _FusionStage(nn.Module):
    def __init__(self, width: int, n: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Fusion(width) for _ in range(n))
        # the coarsest layer has no finer map to add: its first residual unit is never used (kept, as transformers'
        # DPT keeps it, so weights load either way), and left out of training (DDP needs every trainable one used)
        self.layers[0].residual_layer1.requires_grad_(False)

    def forward(self, maps: list[torch.Tensor]) -> torch.Tensor:
        fused = None
        for x, layer in zip(maps[::-1], self.layers):  # coarsest first
            fused = layer(x) if fused is None else layer(fused, x)
        return fused


class _DPTClassifier(nn.Module):
    def __init__(self, width: int, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.head = nn.Sequential(nn.Conv2d(width, width, kernel_size=3, padding=1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(), nn.Dropout(dropout), nn.Conv2d(width, num_classes, kernel_size=1),
                                  nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)

    def forward_many(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Maps of several sizes, (1, width, h_i, w_i) each, -> their logits as `forward` gives them, the
        BatchNorm's statistics taken over every map's pixels at once (as over a batch of one size)."""
        conv, bn, rest = self.head[0], self.head[1], self.head[2:]
        ys = [conv(x) for x in xs]
        flat = bn(torch.cat([y.flatten(2) for y in ys], 2)[..., None])[..., 0]  # (1, width, all pixels)
        parts = flat.split([y.shape[-2] * y.shape[-1] for y in ys], dim=2)
        return [rest(part.reshape(y.shape)) for part, y in zip(parts, ys)]


class DPTHead(nn.Module):
    """DPT's neck and segmentation head on four blocks' maps of width `embed_dim` (module docstring).
    `sizes`: the reassembled widths per scale; `factors`: their resampling; `width`: the fusion width;
    `readout`: "project", "add" or "ignore" (a backbone without a [CLS] token ignores it)."""

    def __init__(self, embed_dim: int, num_classes: int, sizes: tuple[int, ...] = (96, 192, 384, 768),
                 factors: tuple[float, ...] = (4, 2, 1, 0.5), width: int = 256, readout: str = "project",
                 dropout: float = 0.1) -> None:
        super().__init__()
        if readout not in ("project", "add", "ignore"):
            raise ValueError(f"unknown DPT readout {readout!r}; choose 'project', 'add' or 'ignore'.")
        if len(sizes) != len(factors):
            raise ValueError(f"DPT needs one factor per reassembled size, got {len(sizes)} sizes and "
                             f"{len(factors)} factors.")
        self.reassemble_stage = _ReassembleStage(embed_dim, tuple(sizes), tuple(factors), readout)
        self.convs = nn.ModuleList(nn.Conv2d(c, width, kernel_size=3, padding=1, bias=False) for c in sizes)
        self.fusion_stage = _FusionStage(width, len(sizes))
        self.head = _DPTClassifier(width, num_classes, dropout)

    def neck(self, feats: Maps) -> torch.Tensor:
        """Reassembled and fused: the map the classifier reads (B, width, 8h, 8w at factors 4, 2, 1, 0.5)."""
        maps = self.reassemble_stage(feats)
        return self.fusion_stage([conv(x) for conv, x in zip(self.convs, maps)])

    def forward(self, feats: Maps) -> torch.Tensor:
        return self.head(self.neck(feats))  # (B, C, 16h, 16w): the patch size 16 gives the input size

    def forward_many(self, feats: list[Maps]) -> list[torch.Tensor]:
        """Per image (a NaFlex batch: each its own grid) its logits (1, C, h', w'); the neck runs on each grid
        alone, the classifier's BatchNorm over all their pixels at once."""
        return self.head.forward_many([self.neck(f) for f in feats])


SEG_HEADS = {"linear": LinearSegHead, "dpt": DPTHead}  # seg.head's choices
