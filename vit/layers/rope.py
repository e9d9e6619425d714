"""Rotary position embeddings (RoPE; Su et al., 2021, "RoFormer", eq. 34) on a 2-D grid of patches.

Each pair of channels of a query or key is rotated by an angle proportional to the token's position, so the score
q_i . k_j depends on positions only through i - j. Axial 2-D RoPE gives half of the d/2 pairs to the row
coordinate and half to the column coordinate (Heo et al., 2024, "Rotary Position Embedding for Vision
Transformer"; EVA-02, Fang et al., 2023). Nothing is added to the tokens: attention rotates q and k of the patch
tokens, after the projections and before the fused SDPA; prefix tokens ([CLS], registers) are not rotated.

Three schedules, as timm 1.0.31 computes them (`RotaryEmbeddingCat`, `RotaryEmbeddingDinoV3`,
`RotaryEmbeddingMixed`):

    'axial'   EVA02 / RoPE-ViT: integer positions p (+ grid_offset), rescaled to `ref_grid` when given (a model
              fine-tuned on a new grid keeps its pretraining range); frequencies 1 / temperature^(i / n),
              i < n = d / 4; angle = p * frequency.
    'dinov3'  DINOv3 (Simeoni et al., 2025): centred coordinates (p + 0.5 + grid_offset) / size mapped to
              [-1, 1]; periods temperature^(2i / (d / 2)) (or min_period..max_period geometrically);
              angle = 2 pi p / period.
    'mixed'   RoPE-Mixed (Heo et al., 2024): integer positions as 'axial', but every block and head learns its
              own 2-D frequencies (the model's `rope.freqs`, (2, depth, heads, d / 2)): angle = x f_x + y f_y, so
              a pair may turn along any direction of the grid, not only along a row or a column.

A table (N, 2d) holds [sin | cos] of the N = H * W patches' angles in row-major order, each d wide in one of
two layouts of the d/2 angles [a_row..., a_col...]: interleaved (pairs are channels 2i, 2i + 1; EVA02) or
`rotate_half` (pairs are channels i, i + d/2; DINOv3). Tables are recomputed for any grid, square or not.
RoPE-Mixed's table is one per block and head: (depth, 1, heads, N, 2d), interleaved.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..config import Rope  # the options object lives in vit.config (torch-free), so that a config holds it

__all__ = ["MixedRotaryEmbedding", "Rope", "RotaryEmbedding", "apply_rope", "rope_table", "rotary_embedding"]


def _grid(grid) -> tuple[int, int]:
    g = (grid, grid) if isinstance(grid, int) else tuple(grid)
    if len(g) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in g):
        raise ValueError(f"a rotary grid is (height, width) in patches, two whole numbers > 0; got {grid!r}.")
    return g  # type: ignore[return-value]


def _coords(rope: Rope, grid: tuple[int, int]) -> torch.Tensor:
    """Per-axis coordinates (H * W, 2) in float32, row-major, channels (row, column) ('ij') or swapped ('xy')."""
    axes = []
    for size, ref, other in zip(grid, rope.ref_grid or (None, None), (grid[1], grid[0])):
        if rope.kind != "dinov3":  # axial and mixed: integer positions
            t = torch.arange(size, dtype=torch.float32) + rope.grid_offset
            if ref is not None:
                t = t / size * ref
        else:
            denom = {"separate": size, "min": min(size, other), "max": max(size, other)}[rope.normalize_coords]
            t = 2.0 * ((torch.arange(0.5, size, dtype=torch.float32) + rope.grid_offset) / float(denom)) - 1.0
        axes.append(t)
    coords = torch.stack(torch.meshgrid(axes[0], axes[1], indexing="ij"), dim=-1).flatten(0, 1)  # (H * W, 2)
    return coords.flip(-1) if rope.grid_indexing == "xy" else coords


def _angles(rope: Rope, head_dim: int, coords: torch.Tensor) -> torch.Tensor:
    """coords (N, 2) -> angles (N, 2, d / 4) in float32, in timm's order of operations (so tables agree bitwise)."""
    n = head_dim // 4
    if rope.kind == "axial":
        return coords[:, :, None] * (1.0 / rope.temperature ** (torch.arange(n, dtype=torch.float32) / n))
    if rope.min_period is not None:
        periods = rope.min_period * (rope.max_period / rope.min_period) ** torch.linspace(0, 1, n)
    else:
        periods = rope.temperature ** (2.0 * torch.arange(n, dtype=torch.float32) / (head_dim // 2))
    return 2 * math.pi * coords[:, :, None] / periods


def rope_table(rope: Rope, head_dim: int, grid) -> torch.Tensor:
    """[sin | cos] of the rotation angles for a (height, width) grid of patches: (H * W, 2 * head_dim), float32,
    in `rope`'s layout (see the module docstring). head_dim must be a multiple of 4 (two axes, pairs)."""
    if head_dim % 4:
        raise ValueError(f"2-D rotary positions need a head width divisible by 4, got {head_dim}.")
    angles = _angles(rope, head_dim, _coords(rope, _grid(grid))).flatten(1)  # (N, d / 2)
    angles = torch.cat([angles, angles], -1) if rope.rotate_half else angles.repeat_interleave(2, -1)  # (N, d)
    return torch.cat([angles.sin(), angles.cos()], -1)


def _rotate_pairs(x: torch.Tensor, half: bool) -> torch.Tensor:
    """The 90-degree turn of every pair: (a, b) -> (-b, a). Pairs are (2i, 2i + 1), or (i, i + d/2) if `half`."""
    if half:
        a, b = x.chunk(2, dim=-1)
        return torch.cat([-b, a], dim=-1)
    return torch.stack([-x[..., 1::2], x[..., ::2]], -1).flatten(-2)


def apply_rope(x: torch.Tensor, table: torch.Tensor, half: bool = False) -> torch.Tensor:
    """Rotate the last M tokens of x (B, H, N, d) by a table (M, 2d), (B, M, 2d) or per head (1, H, M, 2d); the N - M
    tokens before them
    (prefix tokens) pass unchanged. Computed in the table's precision (float32 at least), returned in x's dtype."""
    sin, cos = table.to(x.device).chunk(2, dim=-1)  # (M, d) each, (B, M, d), or (1, H, M, d) (RoPE-Mixed)
    if sin.dim() == 3:
        sin, cos = sin[:, None], cos[:, None]  # (B, 1, M, d): one table per image, shared by heads
    m = table.shape[-2]
    patches = x[..., x.shape[-2] - m :, :]
    rotated = (patches * cos + _rotate_pairs(patches, half) * sin).to(x.dtype)
    if m == x.shape[-2]:
        return rotated
    return torch.cat([x[..., : x.shape[-2] - m, :], rotated], dim=-2)


class RotaryEmbedding(nn.Module):
    """The table for a grid, computed on first use and kept for the last grid seen (a non-persistent cache: no
    state-dict entries, so timm checkpoints, which store none, load strictly). forward(grid) -> (H * W, 2d)."""

    def __init__(self, rope: Rope, head_dim: int) -> None:
        super().__init__()
        if head_dim % 4:
            raise ValueError(f"2-D rotary positions need a head width divisible by 4, got {head_dim}.")
        self.rope = rope
        self.head_dim = head_dim
        self._cached: tuple[tuple[int, int], torch.Tensor] | None = None

    @torch.jit.unused  # Python: the model calls it from a @torch.jit.ignore method, scripted or not
    def forward(self, grid: tuple[int, int], device: torch.device | None = None) -> torch.Tensor:
        grid = _grid(grid)
        if self._cached is None or self._cached[0] != grid or (device is not None and self._cached[1].device != device):
            self._cached = (grid, rope_table(self.rope, self.head_dim, grid).to(device))
        return self._cached[1]

    def extra_repr(self) -> str:
        return f"{self.rope}, head_dim={self.head_dim}"


class MixedRotaryEmbedding(nn.Module):
    """RoPE-Mixed: learned 2-D frequencies `freqs` (2, depth, heads, d / 2) for (x, y), one set per block and head
    (timm's `rope.freqs`). forward(grid) -> (depth, 1, heads, H * W, 2d): block i rotates by table[i]. Recomputed on
    every call, since the frequencies train."""

    def __init__(self, rope: Rope, head_dim: int, depth: int, num_heads: int) -> None:
        super().__init__()
        if head_dim % 4:
            raise ValueError(f"2-D rotary positions need a head width divisible by 4, got {head_dim}.")
        self.rope = rope
        # RoPE-Mixed's init: the axial magnitudes 1 / T^(4i / d), turned by a random angle per block and head; x and
        # y get the angle and the angle + 90 degrees in each half of the pairs
        mag = 1.0 / rope.temperature ** (torch.arange(0, head_dim, 4, dtype=torch.float32) / head_dim)  # (d / 4,)
        turn = torch.rand(depth, num_heads, 1) * 2 * math.pi
        fx = torch.cat([mag * torch.cos(turn), mag * torch.cos(turn + math.pi / 2)], dim=-1)
        fy = torch.cat([mag * torch.sin(turn), mag * torch.sin(turn + math.pi / 2)], dim=-1)
        self.freqs = nn.Parameter(torch.stack([fx, fy]))  # (2, depth, heads, d / 2)

    @torch.jit.unused  # Python: the model calls it from a @torch.jit.ignore method, scripted or not
    def forward(self, grid: tuple[int, int], device: torch.device | None = None) -> torch.Tensor:
        coords = _coords(self.rope, _grid(grid)).to(self.freqs.device)  # (N, 2): (x, y) for 'xy'
        f = self.freqs.float()
        angles = coords[:, :1] * f[0][..., None, :] + coords[:, 1:] * f[1][..., None, :]  # (depth, heads, N, d / 2)
        table = torch.cat([angles.sin().repeat_interleave(2, -1), angles.cos().repeat_interleave(2, -1)], -1)
        return table[:, None]  # (depth, 1, heads, N, 2d)

    def extra_repr(self) -> str:
        return f"{self.rope}, freqs={tuple(self.freqs.shape)}"


def rotary_embedding(rope: Rope, head_dim: int, depth: int, num_heads: int) -> nn.Module:
    """The model's rotary module for `rope`: a fixed table (`RotaryEmbedding`) or RoPE-Mixed's learned one."""
    if rope.kind == "mixed":
        return MixedRotaryEmbedding(rope, head_dim, depth, num_heads)
    return RotaryEmbedding(rope, head_dim)
