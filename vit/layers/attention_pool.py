"""Multihead attention pooling ("MAP"): a learned latent query attends to the tokens (Lee et al., 2019, "Set
Transformer", PMA; Zhai et al., 2022 for ViT; SigLIP / SigLIP2's head). timm's `AttentionPoolLatent`, one latent:

    q = W_q latent,  [k; v] = W_kv x                  latent (1, 1, D), x (B, N, D)
    y = W_o softmax(q k^T / sqrt(d)) v                (B, 1, D), heads of width d = D / H
    y = y + MLP(Norm(y))                              one pre-norm residual MLP, as a Transformer block's second half

Parameter names are timm's (`latent`, `q`, `kv`, `proj`, `norm`, `mlp.fc1`, `mlp.fc2`), so timm's `attn_pool.*`
weights load. Attention runs through F.scaled_dot_product_attention (the fused kernels).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["AttentionPoolLatent"]


class AttentionPoolLatent(nn.Module):
    """Tokens (B, N, D) -> one pooled vector (B, D) by attention from a learned query, then a residual MLP."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_layer: Callable[..., nn.Module],
        norm_layer: Callable[[int], nn.Module],
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"attention pooling needs embed_dim ({dim}) divisible by num_heads ({num_heads}).")
        self.num_heads = num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.norm = norm_layer(dim)
        self.mlp = mlp_layer(dim, int(dim * mlp_ratio))
        nn.init.trunc_normal_(self.latent, std=dim**-0.5)

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, N, D); valid (B, N): the tokens the latent may attend to (NaFlex padding is False)."""
        B, N, D = x.shape
        H = self.num_heads
        q = self.q(self.latent).expand(B, -1, -1).reshape(B, 1, H, D // H).transpose(1, 2)  # (B, H, 1, d), once
        k, v = self.kv(x).reshape(B, N, 2, H, D // H).permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, N, d) each
        mask = None if valid is None else valid[:, None, None, :]  # (B, 1, 1, N): padding is never a key
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, 1, d)
        y = self.proj(y.transpose(1, 2).reshape(B, 1, D))  # (B, 1, D)
        y = y + self.mlp(self.norm(y))
        return y[:, 0]  # (B, D)
