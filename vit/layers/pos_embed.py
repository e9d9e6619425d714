"""Position embeddings: fixed sine-cosine (1-D and 2-D) and resampling of a learned grid.

1-D sine-cosine follows Vaswani et al. (2017, section 3.5):
    PE(pos, 2i) = sin(pos / 10000^(2i/D)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/D))
(sines and cosines interleaved, so rows match the paper and PyTorch tutorials).
2-D sine-cosine ("Better plain ViT baselines", Beyer et al., 2022; big_vision's `posemb_sincos_2d`) spends
the first half of D on the column index x and the second half on the row index y. Resampling a learned grid
to a new image size follows timm's `resample_abs_pos_embed`: the prefix ([CLS]) rows are kept apart, the grid
is reshaped to (1, D, h, w), interpolated bicubically with antialiasing, and flattened back.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["sincos_1d", "sincos_2d", "resample_abs_pos_embed", "add_pos_embed_1d"]


def sincos_1d(num_positions: int, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """(num_positions, dim) table of the Transformer's sinusoidal encoding; dim must be even."""
    if dim % 2:
        raise ValueError(f"sine-cosine position embeddings need an even width, got {dim}.")
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (N, 1)
    inv_freq = temperature ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (D/2,)
    angles = pos * inv_freq  # (N, D/2)
    pe = torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(num_positions, dim)  # interleaved
    return pe.float()


def sincos_2d(grid_size: tuple[int, int], dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """(h*w, dim) fixed position table for a row-major grid of patches, exactly big_vision's `posemb_sincos_2d`
    ("Better plain ViT baselines", Beyer et al., 2022): blocks of dim/4 columns [sin(x), cos(x), sin(y), cos(y)],
    x the column index and y the row index, with frequencies omega_i = 1 / temperature**(i / (dim/4 - 1)),
    i = 0 .. dim/4 - 1 (so the lowest frequency is exactly 1/temperature). Computed in float64, returned as float32."""
    if dim % 4 or dim < 8:
        raise ValueError(f"2-D sine-cosine position embeddings need a width divisible by 4 and at least 8, got {dim}.")
    h, w = grid_size
    y, x = torch.meshgrid(
        torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij"
    )  # (h, w) each: y[i, j] = i (row), x[i, j] = j (column)
    quarter = dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float64) / (quarter - 1))  # (D/4,)
    xa = x.flatten()[:, None] * omega  # (h*w, D/4)
    ya = y.flatten()[:, None] * omega
    return torch.cat([xa.sin(), xa.cos(), ya.sin(), ya.cos()], dim=1).float()


def resample_abs_pos_embed(
    pos_embed: torch.Tensor,
    new_size: tuple[int, int],
    old_size: tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
    interpolation: str = "bicubic",
    antialias: bool = True,
) -> torch.Tensor:
    """Resample (1, prefix + h*w, D) position embeddings to a (new_h, new_w) grid; prefix rows unchanged."""
    num_grid = pos_embed.shape[1] - num_prefix_tokens
    if old_size is None:
        side = math.isqrt(num_grid)
        if side * side != num_grid:
            raise ValueError(
                f"cannot infer the grid of {num_grid} position embeddings (not a square); pass old_size."
            )
        old_size = (side, side)
    if tuple(old_size) == tuple(new_size):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    dim = grid.shape[-1]
    dtype = grid.dtype
    grid = grid.float().reshape(1, old_size[0], old_size[1], dim).permute(0, 3, 1, 2)  # (1, D, h, w)
    grid = F.interpolate(grid, size=tuple(new_size), mode=interpolation, antialias=antialias)
    grid = grid.permute(0, 2, 3, 1).reshape(1, -1, dim).to(dtype)  # (1, h'*w', D)
    return torch.cat([prefix, grid], dim=1)


def add_pos_embed_1d(module: nn.Module, kind: str, num_positions: int, dim: int) -> None:
    """Give a sequence model its `pos_embed` (1, num_positions, dim): "learn" a parameter drawn N(0, 0.02^2),
    "sincos" the fixed sinusoids, "none" zeros (both buffers, rebuilt rather than saved). The text encoder's and
    the decoder's, so that the two are set up alike."""
    if kind == "learn":
        module.pos_embed = nn.Parameter(torch.randn(1, num_positions, dim) * 0.02)
    else:
        table = sincos_1d(num_positions, dim) if kind == "sincos" else torch.zeros(num_positions, dim)
        module.register_buffer("pos_embed", table[None], persistent=False)
