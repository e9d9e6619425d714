"""The shared encoder on text tokens: token ids -> per-token states and a pooled vector.

Token embedding + position embedding (learned, or the fixed sinusoids of Vaswani et al., 2017, section 3.5)
-> the very same `Encoder`/`Block` classes as the Vision Transformer -> final norm. Padding positions are
masked out of attention (keys) and out of mean pooling; `causal=True` lets each token see only its past
(decoder-style use). `load_torch_encoder` copies weights from PyTorch's `nn.TransformerEncoder`, which also
serves as our numerical oracle in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from .encoder import Encoder
from .layers import get_norm_layer, sincos_1d

__all__ = ["TextEncoder", "TextEncoderOutput"]


@dataclass
class TextEncoderOutput:
    last_hidden_state: torch.Tensor  # (B, N, D), N including the [CLS] slot when there is one
    pooler_output: torch.Tensor  # (B, D)
    attentions: list[torch.Tensor] | None = None  # one (B, H, N, N) map per block when asked


class TextEncoder(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        embed_dim: int = 256,
        depth: int = 4,
        num_heads: int = 4,
        max_len: int = 512,
        mlp_ratio: float = 4.0,
        pos_embed: Literal["learn", "sincos", "none"] = "learn",
        cls_token: bool = False,
        pool: Literal["cls", "mean"] = "mean",
        causal: bool = False,
        norm_first: bool = True,
        norm_layer: str = "layernorm",
        norm_eps: float = 1e-6,
        mlp_layer: str = "gelu",
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        fused_attn: bool = True,
    ) -> None:
        super().__init__()
        if pool not in ("cls", "mean"):
            raise ValueError(f"unknown pool {pool!r}; choose 'cls' or 'mean'.")
        if pool == "cls" and not cls_token:
            raise ValueError("pool='cls' needs cls_token=True; use pool='mean' without it.")
        if pos_embed not in ("learn", "sincos", "none"):
            raise ValueError(f"unknown pos_embed {pos_embed!r}; choose 'learn', 'sincos' or 'none'.")
        norm = get_norm_layer(norm_layer, norm_eps)
        self.pool, self.causal, self.max_len = pool, causal, max_len
        self.num_prefix_tokens = 1 if cls_token else 0
        n_pos = max_len + self.num_prefix_tokens

        self.token_embed = nn.Embedding(vocab_size, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if cls_token else None
        if pos_embed == "learn":
            self.pos_embed = nn.Parameter(torch.randn(1, n_pos, embed_dim) * 0.02)
        elif pos_embed == "sincos":
            self.register_buffer("pos_embed", sincos_1d(n_pos, embed_dim)[None], persistent=False)
        else:
            self.register_buffer("pos_embed", torch.zeros(1, n_pos, embed_dim), persistent=False)
        self.drop = nn.Dropout(drop_rate)
        self.blocks = Encoder(
            depth, embed_dim, num_heads, mlp_ratio, True, drop_rate, attn_drop_rate, drop_path_rate,
            norm_layer=norm, mlp_layer=mlp_layer, norm_first=norm_first, fused_attn=fused_attn,
        )
        self.norm = norm(embed_dim) if norm_first else nn.Identity()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        return_attention: bool = False,
    ) -> TextEncoderOutput:
        """input_ids (B, N) int; attention_mask (B, N), 1 for real tokens and 0 for padding."""
        B, N = input_ids.shape
        if N > self.max_len:
            raise ValueError(f"sequence of {N} tokens is longer than max_len={self.max_len}; truncate it.")
        x = self.token_embed(input_ids)  # (B, N, D)
        keep = None if attention_mask is None else attention_mask.bool()
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)
            if keep is not None:
                keep = torch.cat([keep.new_ones(B, 1), keep], dim=1)
        x = self.drop(x + self.pos_embed[:, : x.shape[1]])
        x, attentions = self.blocks(x, mask=keep, is_causal=self.causal, return_attention=return_attention)
        x = self.norm(x)
        if self.pool == "cls":
            pooled = x[:, 0]
        elif keep is None:
            pooled = x[:, self.num_prefix_tokens :].mean(dim=1)
        else:  # mean over real tokens only: padding contributes nothing
            w = keep[:, self.num_prefix_tokens :, None].to(x.dtype)  # (B, N, 1)
            pooled = (x[:, self.num_prefix_tokens :] * w).sum(1) / w.sum(1).clamp(min=1)
        return TextEncoderOutput(x, pooled, attentions if return_attention else None)

    @torch.no_grad()
    def load_torch_encoder(self, torch_encoder: nn.TransformerEncoder) -> None:
        """Copy the weights of a `nn.TransformerEncoder` (batch_first=True) into this model's blocks (and final
        norm, when the torch encoder has one). Norm placement, width and depth must match."""
        layers = list(torch_encoder.layers)
        if len(layers) != len(self.blocks):
            raise ValueError(f"the torch encoder has {len(layers)} layers, this model {len(self.blocks)}.")
        for layer, blk in zip(layers, self.blocks):
            if layer.norm_first != blk.norm_first:
                raise ValueError("norm placement differs: set norm_first to match the torch encoder's layers.")
            sa = layer.self_attn
            blk.attn.qkv.weight.copy_(sa.in_proj_weight)
            blk.attn.qkv.bias.copy_(sa.in_proj_bias)
            blk.attn.proj.weight.copy_(sa.out_proj.weight)
            blk.attn.proj.bias.copy_(sa.out_proj.bias)
            blk.mlp.fc1.load_state_dict(layer.linear1.state_dict())
            blk.mlp.fc2.load_state_dict(layer.linear2.state_dict())
            blk.norm1.load_state_dict(layer.norm1.state_dict())
            blk.norm2.load_state_dict(layer.norm2.state_dict())
        if torch_encoder.norm is not None:
            self.norm.load_state_dict(torch_encoder.norm.state_dict())
