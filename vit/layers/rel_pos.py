"""Relative position bias: a learned score b_h(i - j) added to every attention logit, per head, indexed by the 2-D
offset between query patch i and key patch j (Shaw et al., 2018; Swin, Liu et al., 2021; BEiT, Bao et al., 2022).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d) + B) V,    B[h, i, j] = b_h(row_i - row_j, col_i - col_j)

On an h x w grid the offsets take (2h - 1)(2w - 1) values; `relative_index` maps each (i, j) pair to one of them.
Two ways to get b, as timm 1.0.31 has them:

    'table'  BEiT (`Beit`): a learned table ((2h - 1)(2w - 1) + 3, H); the 3 extra rows are the [CLS]-to-patch,
             patch-to-[CLS] and [CLS]-to-[CLS] scores. Saved as `attn.relative_position_bias_table`.
    'mlp'    timm's `VisionTransformerRelPos` (Swin-V2's idea, timm's 'cr' coordinates): a 2 -> hidden -> H MLP
             (ReLU) of the log-spaced offsets sign(t) log(1 + |t|); prefix tokens get zero bias. Saved as
             `attn.rel_pos.mlp.fc1.*` / `fc2.*`, or once for all blocks as `shared_rel_pos.*` (`shared=True`).

B enters `F.scaled_dot_product_attention` as a float mask (vit.layers.sdpa), so the fused kernel stays the default
and the explicit path adds the same tensor. The bias is built for one grid: the model refuses other input sizes
unless `set_input_size` moves it (the table resampled as timm's `resize_rel_pos_bias_table`; the MLP just
evaluated at the new offsets).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..config import RelPos  # the options object lives in vit.config (torch-free), so that a config holds it

__all__ = ["RelPos", "RelPosMlp", "RelPosTable", "SharedRelPos", "log_coords", "rel_pos_layers", "relative_index"]

def relative_index(grid: tuple[int, int], class_token: bool = False) -> torch.Tensor:
    """(N, N) long indices of the offsets between the N = h * w patches (row-major), each in
    [0, (2h - 1)(2w - 1)); with `class_token`, (N + 1, N + 1) with the three [CLS] entries after them (BEiT's)."""
    h, w = grid
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    rows, cols = rows.flatten(), cols.flatten()
    index = (rows[:, None] - rows[None, :] + h - 1) * (2 * w - 1) + (cols[:, None] - cols[None, :] + w - 1)
    if class_token:
        n = (2 * h - 1) * (2 * w - 1)
        index = F.pad(index, (1, 0, 1, 0))
        index[0, :], index[:, 0], index[0, 0] = n, n + 1, n + 2  # [CLS] -> patch, patch -> [CLS], [CLS] -> [CLS]
    return index


def log_coords(grid: tuple[int, int]) -> torch.Tensor:
    """The (2h - 1, 2w - 1, 2) offsets (dy, dx), log-spaced as sign(t) log(1 + |t|) (timm's 'cr' mode), float32."""
    dy = torch.arange(-(grid[0] - 1), grid[0], dtype=torch.float32)
    dx = torch.arange(-(grid[1] - 1), grid[1], dtype=torch.float32)
    t = torch.stack(torch.meshgrid(dy, dx, indexing="ij"), dim=-1)
    return torch.sign(t) * torch.log1p(t.abs())


class _Grid(nn.Module):
    """A bias for one grid: its pair index a buffer (not saved: timm saves none), recomputed by `set_grid`."""

    cls_entries = False  # whether [CLS] has its own table entries (BEiT) or zero bias (relpos)

    def __init__(self, grid: tuple[int, int], num_heads: int, prefix: int) -> None:
        super().__init__()
        self.grid, self.num_heads, self.prefix = tuple(grid), num_heads, prefix
        self.register_buffer("relative_position_index", self._index(), persistent=False)

    def _index(self) -> torch.Tensor:
        return relative_index(self.grid, class_token=self.prefix > 0 and self.cls_entries)

    def set_grid(self, grid: tuple[int, int]) -> None:
        self.grid = tuple(grid)
        self.relative_position_index = self._index().to(self.relative_position_index.device)

    def extra_repr(self) -> str:
        return f"grid={self.grid}, num_heads={self.num_heads}, prefix={self.prefix}"


class RelPosTable(_Grid):
    """BEiT's bias: forward() -> (1, H, 1 + N, 1 + N) from the learned `relative_position_bias_table`
    ((2h - 1)(2w - 1) + 3, H); exactly one prefix token ([CLS]) has its own three entries."""

    cls_entries = True

    def __init__(self, grid: tuple[int, int], num_heads: int, prefix: int) -> None:
        if prefix != 1:
            raise ValueError(f"BEiT's relative position table has entries for one [CLS] token, not {prefix} prefix "
                             "tokens; build it with class_token=True and no registers.")
        super().__init__(grid, num_heads, prefix)
        size = (2 * grid[0] - 1) * (2 * grid[1] - 1) + 3
        self.relative_position_bias_table = nn.Parameter(torch.zeros(size, num_heads))  # timm's init: zeros

    def forward(self) -> torch.Tensor:
        table = self.relative_position_bias_table
        n = self.grid[0] * self.grid[1] + 1
        return table[self.relative_position_index.view(-1)].view(n, n, -1).permute(2, 0, 1)[None]  # (1, H, n, n)

    def set_grid(self, grid: tuple[int, int]) -> None:
        """Resample the table for another grid (timm's resize_rel_pos_bias_table, as timm's set_input_size)."""
        grid = tuple(grid)
        if grid != self.grid:
            from timm.layers import resize_rel_pos_bias_table

            old = self.relative_position_bias_table
            shape = ((2 * grid[0] - 1) * (2 * grid[1] - 1) + 3, old.shape[1])
            with torch.no_grad():
                new = resize_rel_pos_bias_table(old.detach(), new_window_size=grid, new_bias_shape=shape,
                                                old_window_size=self.grid)
            self.relative_position_bias_table = nn.Parameter(new, requires_grad=old.requires_grad)
        super().set_grid(grid)


class _BiasMlp(nn.Module):
    """2 -> hidden -> H with ReLU and timm's dropout of 0.125 on the hidden layer (fc1 / fc2, timm's names)."""

    def __init__(self, hidden: int, num_heads: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(2, hidden)
        self.act = nn.ReLU()
        self.drop1 = nn.Dropout(0.125)
        self.fc2 = nn.Linear(hidden, num_heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop1(self.act(self.fc1(x))))


class RelPosMlp(_Grid):
    """timm's VisionTransformerRelPos bias: forward() -> (1, H, prefix + N, prefix + N), the MLP of the log-spaced
    offsets gathered per (query, key) pair; prefix tokens' rows and columns are zero."""

    def __init__(self, grid: tuple[int, int], num_heads: int, prefix: int, hidden_dim: int = 128) -> None:
        super().__init__(grid, num_heads, prefix)
        self.mlp = _BiasMlp(hidden_dim, num_heads)
        self.register_buffer("rel_coords_log", log_coords(self.grid), persistent=False)  # (2h - 1, 2w - 1, 2)

    def set_grid(self, grid: tuple[int, int]) -> None:
        super().set_grid(grid)
        self.rel_coords_log = log_coords(self.grid).to(self.rel_coords_log)

    def forward(self) -> torch.Tensor:
        n = self.grid[0] * self.grid[1]
        bias = self.mlp(self.rel_coords_log).view(-1, self.num_heads)[self.relative_position_index.view(-1)]
        bias = bias.view(n, n, -1).permute(2, 0, 1)  # (H, n, n)
        return F.pad(bias, (self.prefix, 0, self.prefix, 0))[None]  # (1, H, prefix + n, prefix + n)


class SharedRelPos:
    """One bias module that every block's attention calls (timm's `shared_rel_pos`). A plain object, not an
    nn.Module, so the module is saved once, under the model's `shared_rel_pos`, not again under every block."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self) -> torch.Tensor:
        return self.module()


def rel_pos_layers(
    rel_pos: RelPos | None, grid: tuple[int, int], num_heads: int, prefix: int
) -> tuple[nn.Module | None, Callable[[], nn.Module | SharedRelPos] | None]:
    """(the model's shared bias module or None, the factory each block's attention calls for its bias or None)."""
    if rel_pos is None:
        return None, None

    def make() -> nn.Module:
        if rel_pos.kind == "table":
            return RelPosTable(grid, num_heads, prefix)
        return RelPosMlp(grid, num_heads, prefix, rel_pos.hidden_dim)

    if rel_pos.shared:
        shared = make()
        return shared, lambda: SharedRelPos(shared)
    return None, make


def table_names_out(module, state, prefix, local_metadata):
    """state_dict hook of an attention with a BEiT table: `rel_pos.relative_position_bias_table` saved as BEiT's
    `relative_position_bias_table` on the attention itself."""
    key = f"{prefix}rel_pos.relative_position_bias_table"
    if key in state:
        state[f"{prefix}relative_position_bias_table"] = state.pop(key)
    return state


def table_names_in(state, prefix, *args):
    """load_state_dict pre-hook: BEiT's `relative_position_bias_table` read into `rel_pos.`."""
    key = f"{prefix}relative_position_bias_table"
    if key in state:
        state[f"{prefix}rel_pos.relative_position_bias_table"] = state.pop(key)
