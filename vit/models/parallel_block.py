"""The parallel block (Dehghani et al., 2023, "Scaling Vision Transformers to 22 Billion Parameters", section 2;
timm's ParallelScalingBlock), and its differential-attention form (timm's DiffParallelScalingBlock).

Attention and MLP read the same normalised input and their outputs are summed, so their input projections are one
matmul (`in_proj`: D -> hidden + 3D, MLP part first) and, in the differential form, their output projections too:

    y = Norm(x);  [h, q, k, v] = y W_in;  x = x + DropPath(LS(Attn(q, k, v) W_attn + GELU(h) W_mlp))

The attention is the shared formula (`vit.layers.sdpa.attend`: fused SDPA, or explicit for maps); `diff=True`
subtracts two maps as vit.layers.diff_attention does (lambda, its sub-norm, the fused `out_proj` over
[attention; MLP]). timm's names: `in_norm`, `in_proj`, `mlp_bias` (without qkv_bias), `q_norm` / `k_norm`,
`attn_out_proj` / `mlp_out_proj` (or `out_proj`), `ls.gamma`. The block keeps `Block`'s contract (the Encoder's
forward, `fused_attn` through `attn`, which is the block itself: one projection serves both); rotary or relative
positions, sparse attention and token reduction are refused in one sentence (vit.layers.combinations).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..config import AttentionOptions
from ..layers import (
    DropPath,
    LayerScale,
    attend,
    check_combination,
    diff_lambda,
    differential_attend,
    get_norm_layer,
    lambda_parameters,
    merge_heads,
    sdpa_mask,
    split_heads,
)

__all__ = ["ParallelScalingBlock"]


class ParallelScalingBlock(nn.Module):
    """Attention and MLP side by side on one input projection: tokens (B, N, D) -> (B, N, D), `Block`'s
    constructor and forward (the per-block extras it has no use for must be off). `diff=True` with `layer_index`
    makes it timm's DiffParallelScalingBlock."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = True, drop: float = 0.0,
                 attn_drop: float = 0.0, drop_path: float = 0.0, init_values: float | None = None,
                 norm_layer: str | Callable[[int], nn.Module] = "layernorm", mlp_layer: str = "gelu",
                 norm_first: bool = True, attention: AttentionOptions | None = None, diff: bool = False,
                 layer_index: int = 0, rope=None, rel_pos=None, **unused) -> None:
        super().__init__()
        attention = attention or AttentionOptions(qkv_bias)
        check_combination(parallel_block=True, sparse_attention=attention.sparse_attention is not None,
                          rope=rope is not None, rel_pos=rel_pos is not None)
        if mlp_layer != "gelu" or not norm_first or attention.qkv_bias == "qv":
            raise ValueError("a parallel block is timm's: pre-norm, a GELU MLP and a qkv bias on or off; drop "
                             "mlp_layer / norm_first / qkv_bias='qv' or the block.")
        norm = get_norm_layer(norm_layer) if isinstance(norm_layer, str) else norm_layer
        self.num_heads, self.diff, self.fused_attn, self.sparse = num_heads, diff, attention.fused_attn, None
        self.head_dim = dim // num_heads // (2 if diff else 1)  # q / k head width (half of it, differential)
        hidden = int(mlp_ratio * dim)
        self.in_split = [hidden, dim, dim, dim]
        self.in_norm = norm(dim)
        self.in_proj = nn.Linear(dim, hidden + 3 * dim, bias=attention.qkv_bias is True)
        # without a qkv bias the MLP's first bias is its own parameter (with one it is part of in_proj's)
        self.mlp_bias = None if attention.qkv_bias else nn.Parameter(torch.zeros(hidden))
        self.q_norm = norm(self.head_dim) if attention.qk_norm else nn.Identity()
        self.k_norm = norm(self.head_dim) if attention.qk_norm else nn.Identity()
        self.attn_drop, self.mlp_drop, self.mlp_act = nn.Dropout(attn_drop), nn.Dropout(drop), nn.GELU()
        if diff:
            lambda_parameters(self, self.head_dim, layer_index)
            self.sub_norm = nn.RMSNorm(2 * self.head_dim, eps=1e-5)
            self.out_proj = nn.Linear(dim + hidden, dim)
        else:
            self.attn_out_proj, self.mlp_out_proj = nn.Linear(dim, dim), nn.Linear(hidden, dim)
        self.ls = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.token_reduction = None

    feature = "parallel_block"  # its name in vit.layers.combinations

    @property
    def attn(self) -> ParallelScalingBlock:
        """The block is its own attention (one projection serves attention and MLP): `fused_attn`, `num_heads`
        and `sparse` (None) where the Encoder and the model look for them."""
        return self

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, is_causal: bool = False,
                return_attention: bool = False, num_queries: int | None = None, rope: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, N, D) -> (B, N, D) (its first `num_queries` rows when asked), and the attention map (B, H, N, N)
        with `return_attention` (the differential one, p1 - lambda p2, for diff)."""
        check_combination(parallel_block=True, rope_table=rope is not None)
        N = x.shape[1]
        mask, is_causal = sdpa_mask(mask, is_causal, N, N)
        h, q, k, v = torch.split(self.in_proj(self.in_norm(x)), self.in_split, dim=-1)
        if self.mlp_bias is not None:
            h = h + self.mlp_bias
        heads = self.num_heads * (2 if self.diff else 1)
        q, k, v = self.q_norm(split_heads(q, heads)), self.k_norm(split_heads(k, heads)), split_heads(v, self.num_heads)
        explicit, p = return_attention or not self.fused_attn, self.attn_drop.p if self.training else 0.0
        if self.diff:
            a, attn = differential_attend(q, k, v, diff_lambda(self).type_as(q), mask, is_causal, p, explicit)
            a = merge_heads(self.sub_norm(a) * (1 - self.lambda_init))
            y = self.out_proj(torch.cat([a, self.mlp_drop(self.mlp_act(h))], dim=-1))
        else:
            a, attn = attend(q, k, v, mask, is_causal, p, explicit)
            y = self.attn_out_proj(merge_heads(a)) + self.mlp_out_proj(self.mlp_drop(self.mlp_act(h)))
        x = x + self.drop_path(self.ls(y))
        return (x if num_queries is None else x[:, :num_queries]), (attn if return_attention else None)
