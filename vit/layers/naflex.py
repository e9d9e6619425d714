"""NaFlex: images at their native aspect ratio and resolution (Dehghani et al., 2023, "Patch n' Pack: NaViT";
Beyer et al., 2023, "FlexiViT"; SigLIP 2's NaFlex variant; timm's `NaFlexVit`).

An image keeps its aspect ratio and becomes as many P x P patches as a budget allows, an h_i x w_i grid that
differs per image. A batch is timm's dict (its data pipeline's, `timm/data/naflex_transforms.py`):

    patches      float (B, N, P*P*C)  each patch flattened in (p_h, p_w, C) order, row-major over the grid
    patch_coord  long  (B, N, 2)      (row, column) of the patch in its own image's grid
    patch_valid  bool  (B, N)         False for the padding that fills every image up to the batch's N

Each image's grid is (max row + 1, max column + 1) over its valid patches. What a square-grid ViT does once per
batch happens here per image:

    tokens = patches W^T + b                     a Linear, the patch Conv2d's weight flattened in (p_h, p_w, C) order
    pos_i  = resample(E_pos, (h_i, w_i))[r, c]   the learned (h0, w0, D) table resampled to each image's grid
                                                 (timm's mode, align_corners and antialias), read at the patch
    rope_i = table(h_i, w_i)[r * w_i + c]        rotary angles of the patch's (row, column) in its own grid
    mask   = [prefix; patch_valid]               padded tokens are never keys (B, 1, 1, prefix + N)

Resampling is linear in the table, so resample(E, (h, w)) = R_h E R_w^T with per-axis weights R_n (n, n0):
`NaFlexEmbeds.positions_by_weights` reads those weights per patch from a lookup table (no Python loop over grids,
no size taken from data), which is what an exporter can trace with a dynamic sequence length.
Parameter names are timm's `NaFlexEmbeds` ones (`embeds.proj`, `embeds.pos_embed` (1, h0, w0, D) or the
factorized `embeds.pos_embed_y` (1, h0, D) + `embeds.pos_embed_x` (1, w0, D), `embeds.cls_token`,
`embeds.reg_token`), so timm's `naflexvit_*` weights load strictly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import NaFlex  # the options object lives in vit.config (torch-free), so that a config holds it
from .patch_embed import to_2tuple
from .rope import RotaryEmbedding, rope_table

__all__ = ["MAX_GRID_PATCHES", "NaFlex", "NaFlexEmbeds", "PatchGrid", "check_batch", "grid_sizes", "key_padding_mask",
           "naflex_grids", "naflex_rope_table", "patchify", "resample_weights"]

NAFLEX_KEYS = ("patches", "patch_coord", "patch_valid")
# The largest grid (rows x columns) an image may claim beyond the batch's sequence length N: positions and rotary
# angles are computed over each image's whole grid, so a coordinate sets an allocation of h*w*D. A complete image
# has h*w = its patches <= N; a sparse one (patches dropped) may span up to this many (256 x 256, 4096 px at P 16).
MAX_GRID_PATCHES = 65536


def patchify(images: torch.Tensor, patch_size: tuple[int, int]) -> dict[str, torch.Tensor]:
    """Images (B, C, H, W) -> a NaFlex batch of their full grids: patches (B, h*w, P_h*P_w*C) flattened in
    (p_h, p_w, C) order (timm's `batch_patchify`, channels last), coordinates row-major, all valid."""
    B, C, H, W = images.shape
    ph, pw = patch_size
    if H % ph or W % pw:
        raise ValueError(f"images of size {H}x{W} are not divisible by the patch size {ph}x{pw}; resize or crop "
                         "them to a multiple of the patch size.")
    h, w = H // ph, W // pw
    patches = images.reshape(B, C, h, ph, w, pw).permute(0, 2, 4, 3, 5, 1).reshape(B, h * w, ph * pw * C)
    rows, cols = torch.meshgrid(torch.arange(h, device=images.device), torch.arange(w, device=images.device),
                                indexing="ij")
    coord = torch.stack([rows, cols], -1).reshape(1, h * w, 2).expand(B, -1, -1)
    valid = torch.ones(B, h * w, dtype=torch.bool, device=images.device)
    return {"patches": patches, "patch_coord": coord, "patch_valid": valid}


def check_batch(batch: dict, patch_dim: int) -> None:
    """Raise one sentence for a NaFlex batch this model cannot read (keys, shapes, dtypes, an empty image)."""
    missing = [k for k in NAFLEX_KEYS if k not in batch]
    if missing:
        raise ValueError(f"a NaFlex batch needs the keys {', '.join(NAFLEX_KEYS)}; {', '.join(missing)} missing.")
    p, c, v = batch["patches"], batch["patch_coord"], batch["patch_valid"]
    if p.dim() != 3 or p.shape[-1] != patch_dim:
        raise ValueError(f"NaFlex patches must be (batch, patches, {patch_dim}) (P*P*C, flattened in (p_h, p_w, C) "
                         f"order), got {list(p.shape)}.")
    if tuple(c.shape) != (*p.shape[:2], 2) or c.is_floating_point() or tuple(v.shape) != tuple(p.shape[:2]):
        raise ValueError(f"patch_coord must be integer (batch, patches, 2) and patch_valid (batch, patches) for "
                         f"patches {list(p.shape)}; got {list(c.shape)} {c.dtype} and {list(v.shape)}.")
    if v.dtype != torch.bool:
        raise ValueError(f"patch_valid must be boolean (False = padding), got {v.dtype}.")
    if torch.compiler.is_exporting():  # the checks below read data
        return
    if not bool(v.any(1).all()):
        raise ValueError("an image of the NaFlex batch has no valid patch; drop it from the batch.")
    if bool((c < 0).any()):
        raise ValueError("patch_coord holds a negative row or column; coordinates count patches from 0 at the "
                         "image's top-left.")
    limit = max(p.shape[1], MAX_GRID_PATCHES)  # before anything is allocated over a grid
    last = (c * v[..., None]).amax(1).clamp(max=limit)  # (B, 2) each image's last row and column (no overflow)
    area = (last[:, 0] + 1) * (last[:, 1] + 1)
    if bool((area > limit).any()):
        b = int(area.argmax())
        raise ValueError(f"image {b} of the NaFlex batch has a patch at (row, column) {tuple(last[b].tolist())}, so "
                         f"its grid would exceed {limit} patches (the batch's sequence length, or "
                         f"{MAX_GRID_PATCHES} when that is less) with {int(v[b].sum())} valid; coordinates count "
                         "the image's patches from 0.")


def grid_sizes(coord: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Each image's grid (B, 2) = (rows, columns): the largest valid coordinate + 1 (padding's is ignored)."""
    return (coord * valid[..., None]).amax(1) + 1


def key_padding_mask(valid: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """patch_valid (B, N) -> SDPA's boolean mask (B, 1, 1, prefix + N): every query may attend to the prefix
    tokens and the valid patches, never to padding. Four dimensions, so no batch size is mistaken for a
    (tokens, tokens) mask. Valid tokens then get the same outputs as with timm's symmetric (B, 1, S, S) mask."""
    prefix = valid.new_ones(valid.shape[0], num_prefix_tokens)
    return torch.cat([prefix, valid], 1)[:, None, None, :]


def naflex_grids(tokens: torch.Tensor, coord: torch.Tensor, valid: torch.Tensor) -> list[torch.Tensor]:
    """Patch tokens (B, N, D) back onto each image's grid: a list of B maps (D, h_i, w_i), zero where no valid
    patch lies (timm's NaFlexVit returns only the sequence; this is its (C, H, W) form per image)."""
    out = []
    for b, (h, w) in enumerate(grid_sizes(coord, valid).tolist()):
        keep = valid[b]
        grid = tokens.new_zeros(h * w, tokens.shape[-1])
        grid[coord[b, keep, 0] * w + coord[b, keep, 1]] = tokens[b, keep]
        out.append(grid.T.reshape(-1, h, w))
    return out


def _groups(coord: torch.Tensor, valid: torch.Tensor) -> dict[tuple[int, int], list[int]]:
    """{(h, w): [images with that grid]}: each distinct grid is resampled once."""
    groups: dict[tuple[int, int], list[int]] = {}
    for b, (h, w) in enumerate(grid_sizes(coord, valid).tolist()):
        groups.setdefault((h, w), []).append(b)
    return groups


def _gather(tables: dict[tuple[int, int], tuple[torch.Tensor, list[int]]], coord: torch.Tensor,
            valid: torch.Tensor) -> torch.Tensor:
    """Per-grid tables {(h, w): ((h*w, K), images)} -> one row per patch (B, N, K) in one gather: the tables
    stacked, each image's patches read at its table's offset + row * w + column (padding reads its table's row 0:
    it is masked)."""
    B = coord.shape[0]
    offset, width = coord.new_zeros(B), coord.new_zeros(B)
    start = 0
    for (h, w), (_, images) in tables.items():
        offset[images], width[images] = start, w
        start += h * w
    stacked = torch.cat([table for table, _ in tables.values()])  # (sum of h*w, K)
    idx = offset[:, None] + (coord[..., 0] * width[:, None] + coord[..., 1]) * valid  # (B, N)
    return stacked[idx]


def naflex_rope_table(rotary: RotaryEmbedding, coord: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The rotary table per patch (B, N, 2d): each image's (h_i, w_i) table (vit.layers.rope.rope_table, so the
    'dinov3' coordinates are normalized by the image's own grid) read at the patch's (row, column)."""
    tables = {grid: (rope_table(rotary.rope, rotary.head_dim, grid).to(coord.device), images)
              for grid, images in _groups(coord, valid).items()}
    return _gather(tables, coord, valid)


def resample_weights(n_out: int, n_in: int, mode: str, align_corners: bool, antialias: bool) -> torch.Tensor:
    """The (n_out, n_in) matrix R with F.interpolate(t, n_out) = R t along one axis: the float64 identity through
    the same call, so the weights are PyTorch's own, antialiasing included. The identity runs along the width of
    a (1, n_in, 1, n_in) input (along the height of an (n_in, 1) one, PyTorch 2.14's antialiased kernels gave
    other weights than its 2-D call uses), or through the 1-D 'linear' mode."""
    eye = torch.eye(n_in, dtype=torch.float64)[None]  # (1, n_in channels, n_in)
    if mode == "linear":
        out = F.interpolate(eye, size=n_out, mode="linear", align_corners=align_corners)  # (1, n_in, n_out)
    else:
        out = F.interpolate(eye[:, :, None], size=(1, n_out), mode=mode, align_corners=align_corners,
                            antialias=antialias)[:, :, 0]  # (1, n_in, n_out)
    return out[0].T.float()  # (n_out, n_in)


class PatchGrid(nn.Module):
    """A NaFlex model's patch geometry (no weights): the configured image size, patch size and grid, and
    images (B, C, H, W) -> their full NaFlex batch (`patchify`). Stands where a square ViT has `patch_embed`."""

    def __init__(self, img_size: int | tuple[int, int], patch_size: int | tuple[int, int]) -> None:
        super().__init__()
        self.patch_size = to_2tuple(patch_size)
        self.set_input_size(img_size)

    @property
    def reduction(self) -> int:
        """Input pixels per token along the longer patch side (timm's feature_info reduction)."""
        return max(self.patch_size)

    def dynamic_grid(self, height: int, width: int) -> tuple[int, int]:
        ph, pw = self.patch_size
        if height % ph or width % pw:
            raise ValueError(f"input of size {height}x{width} is not divisible by the patch size {ph}x{pw}; "
                             "resize or crop it to a multiple of the patch size.")
        return height // ph, width // pw

    def set_input_size(self, img_size: int | tuple[int, int] | None = None,
                       patch_size: int | tuple[int, int] | None = None) -> None:
        if patch_size is not None and to_2tuple(patch_size) != self.patch_size:
            raise ValueError("a NaFlex model's patch size is fixed (its Linear reads P*P*C values); resample the "
                             "images instead, NaFlex takes any grid.")
        if img_size is not None:
            self.img_size = to_2tuple(img_size)
            self.grid_size = self.dynamic_grid(*self.img_size)
            self.num_patches = self.grid_size[0] * self.grid_size[1]

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        return patchify(images, self.patch_size)


class NaFlexEmbeds(nn.Module):
    """A NaFlex batch -> tokens (B, prefix + N, D): patches projected by a Linear, positions resampled per image
    and added to the patches, then [CLS] and registers prepended (they get no position), as timm's NaFlexEmbeds.

    Args:
        img_size, patch_size, in_chans, embed_dim: as VisionTransformer's.
        class_token, reg_tokens: the prefix tokens (timm: `cls_token` (1, 1, D), `reg_token` (1, R, D)).
        options: a `NaFlex` (the table's grid and how it is resampled).
        pos_embed: False: no position table (positions from rotary embeddings only).
        bias: the projection's bias (False after CLIP's pre-norm, as timm).
    """

    def __init__(
        self,
        img_size: int | tuple[int, int],
        patch_size: int | tuple[int, int],
        in_chans: int,
        embed_dim: int,
        class_token: bool,
        reg_tokens: int,
        options: NaFlex,
        pos_embed: bool = True,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.grid = PatchGrid(img_size, patch_size)
        self.options = options
        ph, pw = self.grid.patch_size
        self.proj = nn.Linear(ph * pw * in_chans, embed_dim, bias=bias)  # the patch Conv2d's weight, (p_h, p_w, C)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, reg_tokens, embed_dim)) if reg_tokens else None
        h0, w0 = options.pos_grid or self.grid.grid_size
        self.pos_embed = self.pos_embed_y = self.pos_embed_x = None
        if pos_embed and options.factorized:
            self.pos_embed_y = nn.Parameter(torch.empty(1, h0, embed_dim))
            self.pos_embed_x = nn.Parameter(torch.empty(1, w0, embed_dim))
        elif pos_embed:
            self.pos_embed = nn.Parameter(torch.empty(1, h0, w0, embed_dim))
        for p in (self.pos_embed, self.pos_embed_y, self.pos_embed_x):
            if p is not None:
                nn.init.normal_(p, std=0.02)
        for p in (self.cls_token, self.reg_token):
            if p is not None:
                nn.init.normal_(p, std=1e-6)

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.cls_token is not None) + (0 if self.reg_token is None else self.reg_token.shape[1])

    def forward(self, patches: torch.Tensor, coord: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        x = self.proj(patches)  # (B, N, D)
        if self.pos_embed is not None or self.pos_embed_y is not None:
            x = x + self.positions(coord, valid).to(x.dtype)
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        return torch.cat(prefix + [x], 1) if prefix else x  # (B, prefix + N, D)

    def _table(self, grid: tuple[int, int]) -> torch.Tensor:
        """The position table resampled to one grid (h*w, D), as timm computes it (float32)."""
        h, w = grid
        o = self.options
        side = (max(h, w),) * 2 if o.ar_preserving else (h, w)
        if self.pos_embed is not None:
            h0, w0 = self.pos_embed.shape[1:3]
            if (h, w) == (h0, w0):
                return self.pos_embed.reshape(h0 * w0, -1).float()
            table = F.interpolate(self.pos_embed.permute(0, 3, 1, 2).float(), size=side, mode=o.interp_mode,
                                  align_corners=o.align_corners, antialias=o.antialias)[:, :, :h, :w]
            return table.flatten(2)[0].T  # (h*w, D)
        axes = []
        for table, n, n_out in ((self.pos_embed_y, h, side[0]), (self.pos_embed_x, w, side[1])):
            if n_out != table.shape[1]:  # timm: linear, no align_corners, no antialias, then the first n rows
                table = F.interpolate(table.permute(0, 2, 1).float(), size=n_out, mode="linear",
                                      align_corners=False).permute(0, 2, 1)
            axes.append(table[0, :n].float())
        return (axes[0][:, None] + axes[1][None, :]).flatten(0, 1)  # (h*w, D)

    def positions(self, coord: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Positions per patch (B, N, D): each distinct grid's table resampled once, read at (row, column)."""
        tables = {grid: (self._table(grid), images) for grid, images in _groups(coord, valid).items()}
        return _gather(tables, coord, valid)

    def position_weights(self, max_side: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-axis resampling weights for every grid side up to `max_side`: (max_side + 1, max_side, n0) for
        rows and columns; entry [n, i] is output row i's weights when the axis is resampled to n (the exporter's
        lookup tables, see positions_by_weights)."""
        o = self.options
        mode = "linear" if self.pos_embed is None else o.interp_mode
        h0, w0 = (self.pos_embed_y.shape[1], self.pos_embed_x.shape[1]) if self.pos_embed is None \
            else self.pos_embed.shape[1:3]
        out = []
        for n0 in (h0, w0):
            table = torch.zeros(max_side + 1, max_side, n0)
            for n in range(1, max_side + 1):
                r = resample_weights(n, n0, mode, o.align_corners and mode != "linear",
                                     o.antialias and mode != "linear")
                table[n, : min(n, max_side)] = r[:max_side]
            out.append(table)
        return out[0], out[1]

    def positions_by_weights(self, coord: torch.Tensor, valid: torch.Tensor, weights_y: torch.Tensor,
                             weights_x: torch.Tensor) -> torch.Tensor:
        """`positions` without a Python loop or a size read from data (for export with a dynamic sequence):
        pos[b, n] = sum_ij R_y[i] E[i, j] R_x[j] with R read from `position_weights` at the image's side
        (max(h, w) for both when aspect-preserving) and the patch's row and column. (B, N, D)."""
        sizes = grid_sizes(coord, valid)  # (B, 2)
        if self.options.ar_preserving:
            sizes = sizes.amax(1, keepdim=True).expand(-1, 2)
        n_y = sizes[:, None, 0].expand_as(coord[..., 0])
        n_x = sizes[:, None, 1].expand_as(coord[..., 1])
        ry = weights_y.to(coord.device)[n_y, coord[..., 0]]  # (B, N, h0)
        rx = weights_x.to(coord.device)[n_x, coord[..., 1]]  # (B, N, w0)
        if self.pos_embed is None:  # factorized: each axis on its own
            return ry @ self.pos_embed_y[0].float() + rx @ self.pos_embed_x[0].float()
        table = self.pos_embed[0].float()  # (h0, w0, D)
        rows = torch.einsum("bni,ijd->bnjd", ry, table)  # (B, N, w0, D)
        return torch.einsum("bnjd,bnj->bnd", rows, rx)
