"""Windowed attention with decomposed relative positions (Li et al., 2022, "Exploring Plain Vision Transformer
Backbones for Object Detection" (ViTDet), section 3; SAM's image encoder, Kirillov et al., 2023; timm's
VisionTransformerSAM attention).

The (h, w) grid of patch tokens is padded with zeros at the bottom and right to whole windows of S x S tokens and each
window attends within itself (a global block: one window, the whole grid). The scores get MViTv2's decomposed
relative position bias (Li et al., 2022, "MViTv2", eq. 4), read from the query itself:

    score(i, j) = q_i . k_j / sqrt(d) + q_i . R^h[y_i - y_j] + q_i . R^w[x_i - x_j]

with `rel_pos_h` (2S_h - 1, d) and `rel_pos_w` (2S_w - 1, d) tables (timm's names), one float mask for `attend`'s one
SDPA call, so the fused and explicit paths see the same scores. Padding tokens are keys as in timm (their values are
qkv's bias), and are cropped from the output. Maps (`return_attention`) are scattered back to the (B, H, N, N) grid
of real tokens: zero outside a token's window (and for the padding it attended), so rollout reads what each token saw.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import Attention
from .combinations import check_combination
from .sdpa import attend

__all__ = ["WindowedAttention", "decomposed_rel_pos", "window_partition", "window_unpartition"]


def window_partition(x: torch.Tensor, size: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """(B, h, w, C) -> windows (B * nW, S * S, C) row-major within each and over them, zero-padded to whole windows;
    and the padded grid (hp, wp)."""
    B, h, w, C = x.shape
    hp, wp = -(-h // size) * size, -(-w // size) * size
    x = F.pad(x, (0, 0, 0, wp - w, 0, hp - h)).view(B, hp // size, size, wp // size, size, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, size * size, C), (hp, wp)


def window_unpartition(windows: torch.Tensor, size: int, grid: tuple[int, int], padded: tuple[int, int]
                       ) -> torch.Tensor:
    """The inverse of `window_partition`: windows (B * nW, S * S, C) -> (B, h, w, C), the padding cropped."""
    (h, w), (hp, wp) = grid, padded
    x = windows.view(-1, hp // size, wp // size, size, size, windows.shape[-1]).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, hp, wp, windows.shape[-1])[:, :h, :w]


def _table(rel: torch.Tensor, size: int) -> torch.Tensor:
    """(size, size, d): the table's row for every (query, key) offset along one axis, resampled linearly (as timm)
    when the table was made for another size."""
    if rel.shape[0] != 2 * size - 1:
        rel = F.interpolate(rel.T[None], size=2 * size - 1, mode="linear")[0].T
    offsets = torch.arange(size, device=rel.device)[:, None] - torch.arange(size, device=rel.device)[None] + size - 1
    return rel[offsets]


def decomposed_rel_pos(q: torch.Tensor, rel_h: torch.Tensor, rel_w: torch.Tensor, size: tuple[int, int]
                       ) -> torch.Tensor:
    """The score bias (B, H, N, N) of queries q (B, H, N, d) on an (s_h, s_w) grid of N tokens (MViTv2's eq. 4)."""
    sh, sw = size
    B, H, N, d = q.shape
    r = q.reshape(B, H, sh, sw, d)
    bias_h = torch.einsum("bnyxc,ykc->bnyxk", r, _table(rel_h, sh))  # (B, H, sh, sw, sh): query . R^h[dy]
    bias_w = torch.einsum("bnyxc,xkc->bnyxk", r, _table(rel_w, sw))  # (B, H, sh, sw, sw): query . R^w[dx]
    return (bias_h[..., :, None] + bias_w[..., None, :]).reshape(B, H, N, N)


class WindowedAttention(Attention):
    """`Attention` over S x S windows of the patch grid (`window_size` 0: the whole grid, SAM's global blocks), with
    decomposed relative positions (`rel_pos_h` / `rel_pos_w`) when `use_rel_pos`. Tokens (B, h*w, D) in, no prefix
    tokens; `grid` (h, w) is the grid they form (the model sets it for each input, `set_grid`)."""

    feature = "windowed_attention"  # its name in vit.layers.combinations

    def __init__(self, dim: int, num_heads: int = 8, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 window_size: int = 0, grid: tuple[int, int] = (14, 14), use_rel_pos: bool = True,
                 **attention) -> None:
        options = attention.get("options")
        check_combination(windowed_attention=True, rope=attention.get("rope") is not None,
                          rel_pos=attention.get("rel_pos") is not None,
                          sparse_attention=options is not None and options.sparse_attention is not None)
        super().__init__(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop, **attention)
        self.window_size, self.grid = window_size, tuple(grid)
        size = (window_size, window_size) if window_size else self.grid
        self.rel_pos_h = nn.Parameter(torch.zeros(2 * size[0] - 1, self.head_dim)) if use_rel_pos else None
        self.rel_pos_w = nn.Parameter(torch.zeros(2 * size[1] - 1, self.head_dim)) if use_rel_pos else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, is_causal: bool = False,
                return_attention: bool = False, num_queries: int | None = None, rope: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, h*w, D) -> (output (B, h*w, D) or its first `num_queries` rows, maps (B, H, N, N) or None)."""
        check_combination(windowed_attention=True, attn_mask=mask is not None or is_causal,
                          rope_table=rope is not None)
        B, N, D = x.shape
        h, w = self.grid
        size = self.window_size or max(h, w)
        if self.window_size:
            tokens, padded = window_partition(x.view(B, h, w, D), size)  # (B * nW, S*S, D)
            shape = (size, size)
        else:
            tokens, padded, shape = x, self.grid, self.grid
        q, k, v = self._qkv(tokens)
        bias = None if self.rel_pos_h is None else decomposed_rel_pos(q, self.rel_pos_h, self.rel_pos_w, shape)
        out, attn = attend(q, k, v, bias, False, self._dropout_p(), return_attention or not self.fused_attn)
        out = self._project(out)  # (B * nW, S*S, D)
        if self.window_size:
            out = window_unpartition(out, size, (h, w), padded).reshape(B, N, D)
        if attn is not None and self.window_size:
            attn = self._full_maps(attn, B, padded)
        return (out if num_queries is None else out[:, :num_queries]), (attn if return_attention else None)

    def _full_maps(self, attn: torch.Tensor, batch: int, padded: tuple[int, int]) -> torch.Tensor:
        """Window maps (B * nW, H, S*S, S*S) -> (B, H, N, N) over the real tokens: each token's row holds its
        window's keys, zero elsewhere; rows and columns of padding dropped."""
        h, w = self.grid
        size = self.window_size
        index = torch.arange(h * w, device=attn.device).view(1, h, w, 1)
        index = window_partition(index + 1, size)[0][..., 0] - 1  # (nW, S*S): token index, -1 for padding
        nw, H = index.shape[0], attn.shape[1]
        full = attn.new_zeros(batch, H, h * w + 1, h * w + 1)  # the last row / column collects the padding
        flat = torch.where(index < 0, h * w, index)  # (nW, S*S)
        rows = flat[:, :, None].expand(-1, -1, size * size)
        cols = flat[:, None, :].expand(-1, size * size, -1)
        maps = attn.view(batch, nw, H, size * size, size * size).transpose(1, 2)  # (B, H, nW, S*S, S*S)
        full[:, :, rows, cols] = maps
        return full[:, :, : h * w, : h * w]
