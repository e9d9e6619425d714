"""Masked autoencoder (He et al. 2022, "Masked Autoencoders Are Scalable Vision Learners"), as
facebookresearch/mae and transformers' `ViTMAEForPreTraining` compute it:

    noise (B, N) ~ U(0, 1); keep the K = int(N (1 - ratio)) patches of lowest noise           (random_masking)
    latent  = encoder(the kept patches with their positions, [CLS] first)                     (B, 1 + K, D)
    tokens  = unshuffle([latent, mask tokens]) + decoder positions  ->  decoder blocks        (B, 1 + N, d)
    pred    = decoder_pred(decoder_norm(tokens))[:, 1:]                                        (B, N, p*p*C)
    target  = patchify(images), each patch normalised by its own mean and variance (norm_pix_loss)
    loss    = sum(mask * mean_pixels((pred - target)^2)) / sum(mask)                           (hidden patches)

The encoder is any VisionTransformer of this package (its `encode(x, patch_keep=...)` drops the masked tokens after
positions are added); the decoder is built from the same `Block` (vit/models/encoder.py) at its own width, with
MAE's fixed 2-D sine-cosine positions. Only the encoder is kept after pretraining.
"""

from __future__ import annotations

import torch
from torch import nn

from .encoder import Encoder

__all__ = ["random_masking", "patchify", "unpatchify", "mae_loss", "mae_sincos", "MAEDecoder", "encode_visible",
           "reconstruction"]


def random_masking(batch: int, patches: int, ratio: float, noise: torch.Tensor | None = None,
                   device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids_keep (B, K), mask (B, N) with 1 = hidden, ids_restore (B, N)) for a per-image random shuffle of `noise`
    (uniform noise drawn when None), K = int(N * (1 - ratio))."""
    if noise is None:
        noise = torch.rand(batch, patches, device=device)
    keep = int(patches * (1 - ratio))
    ids_shuffle = noise.argsort(dim=1)  # ascending: the lowest noise is kept
    ids_restore = ids_shuffle.argsort(dim=1)
    mask = torch.ones(batch, patches, device=noise.device)
    mask[:, :keep] = 0
    return ids_shuffle[:, :keep], mask.gather(1, ids_restore), ids_restore


def patchify(images: torch.Tensor, patch: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, h*w, p*p*C), each patch's pixels in (row, column, channel) order."""
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(b, (h // patch) * (w // patch), patch * patch * c)


def unpatchify(patches: torch.Tensor, patch: int, channels: int, grid: tuple[int, int]) -> torch.Tensor:
    """The inverse of `patchify`: (B, h*w, p*p*C) -> (B, C, h*p, w*p)."""
    b, (h, w) = patches.shape[0], grid
    x = patches.reshape(b, h, w, patch, patch, channels)
    return x.permute(0, 5, 1, 3, 2, 4).reshape(b, channels, h * patch, w * patch)


def mae_loss(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, norm_pix: bool = True) -> torch.Tensor:
    """Mean squared error on the hidden patches; `target` (B, N, p*p*C) normalised per patch when `norm_pix`
    (unbiased variance + 1e-6, as MAE)."""
    if norm_pix:
        mean, var = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
        target = (target - mean) / (var + 1.0e-6) ** 0.5
    per_patch = ((pred - target) ** 2).mean(dim=-1)  # (B, N)
    return (per_patch * mask).sum() / mask.sum()


def mae_sincos(grid: tuple[int, int], dim: int) -> torch.Tensor:
    """MAE's fixed positions (1, 1 + h*w, dim): [CLS] zeros, then sin / cos of each patch's column, then of its row
    (get_2d_sincos_pos_embed: a quarter of `dim` each, frequencies 1 / 10000^(i / (dim / 4)))."""
    h, w = grid
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))
    rows, cols = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64),
                                indexing="ij")
    parts = []
    for coord in (cols.reshape(-1), rows.reshape(-1)):
        angles = coord[:, None] * omega[None]  # (h*w, dim/4)
        parts += [angles.sin(), angles.cos()]
    table = torch.cat(parts, dim=1)
    return torch.cat([table.new_zeros(1, dim), table]).float()[None]


class MAEDecoder(nn.Module):
    """The lightweight decoder: encoder tokens (B, 1 + K, D) and ids_restore (B, N) -> pixels (B, N, p*p*C).
    Parameter names follow MAE's (`decoder_embed`, `mask_token`, `decoder_pos_embed`, `decoder_blocks`,
    `decoder_norm`, `decoder_pred`)."""

    def __init__(self, encoder_dim: int, grid: tuple[int, int], patch: int, channels: int, dim: int = 64,
                 depth: int = 2, num_heads: int = 4, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.decoder_embed = nn.Linear(encoder_dim, dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.register_buffer("decoder_pos_embed", mae_sincos(grid, dim), persistent=False)
        self.decoder_blocks = Encoder(depth, dim, num_heads, mlp_ratio)
        self.decoder_norm = nn.LayerNorm(dim, eps=1e-6)
        self.decoder_pred = nn.Linear(dim, patch * patch * channels)
        nn.init.normal_(self.mask_token, std=0.02)

    def forward(self, latent: torch.Tensor, ids_restore: torch.Tensor) -> torch.Tensor:
        x = self.decoder_embed(latent)  # (B, 1 + K, d)
        b, n = ids_restore.shape
        masked = self.mask_token.expand(b, n + 1 - x.shape[1], -1)
        x_ = torch.cat([x[:, 1:], masked], dim=1)  # (B, N, d) in shuffled order
        x_ = x_.gather(1, ids_restore[..., None].expand(-1, -1, x.shape[-1]))  # back to the grid's order
        x = torch.cat([x[:, :1], x_], dim=1) + self.decoder_pos_embed.to(x.dtype)
        x, _ = self.decoder_blocks(x)
        return self.decoder_pred(self.decoder_norm(x))[:, 1:]  # (B, N, p*p*C)


def encode_visible(model: nn.Module, images: torch.Tensor, ids_keep: torch.Tensor) -> torch.Tensor:
    """The encoder's normalised tokens (B, prefix + K, D) of the kept patches only."""
    return model.encode(images, patch_keep=ids_keep)[0]


def reconstruction(pred: torch.Tensor, images: torch.Tensor, mask: torch.Tensor, patch: int,
                   norm_pix: bool = True) -> torch.Tensor:
    """`pred` in pixel space (B, C, H, W): un-normalised by each target patch's own mean and std when `norm_pix`
    (the pictures of docs/pretraining.md), the visible patches left as the image has them."""
    target = patchify(images, patch)
    if norm_pix:
        mean, var = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
        pred = pred * (var + 1.0e-6) ** 0.5 + mean
    mixed = torch.where(mask[..., None].bool(), pred, target)
    grid = (images.shape[-2] // patch, images.shape[-1] // patch)
    return unpatchify(mixed, patch, images.shape[1], grid)


