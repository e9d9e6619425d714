"""Differential attention (Ye et al., 2024, "Differential Transformer", eqs. 1-3; timm's DiffAttention).

Each head splits its queries and keys in two halves of width d/2 and subtracts two softmax maps, which cancels the
attention both halves give to irrelevant tokens (common-mode noise):

    DiffAttn(X) = (softmax(Q1 K1^T / sqrt(d/2)) - lambda softmax(Q2 K2^T / sqrt(d/2))) V          V of width d
    lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init,   lambda_init = 0.8 - 0.6 exp(-0.3 l)   (block l)
    head_out = (1 - lambda_init) RMSNorm(DiffAttn(X))                                                 (eq. 3)

The same `qkv` and `proj` as `Attention` (timm's names: `lambda_q1`, `lambda_k1`, `lambda_q2`, `lambda_k2`,
`sub_norm`). The fused path is two `attend` calls (SDPA each) on the two halves; the explicit path returns the
differential map p1 - lambda p2 (B, H, N, N), the weights the values were mixed with (signed; each row sums to
1 - lambda), which is what `forward_with_attention` and rollout see. Rotary positions, relative position bias,
sparse attention and token reduction are refused (vit.layers.combinations): timm's layer has none of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ..config import AttentionOptions
from .attention import Attention
from .block_parts import BlockParts
from .combinations import check_combination
from .sdpa import attend, merge_heads, sdpa_mask, split_heads

__all__ = ["DiffAttention", "diff_lambda", "diff_lambda_init", "differential_attend", "lambda_parameters"]


def diff_lambda_init(layer_index: int) -> float:
    """The paper's depth schedule of lambda_init (eq. 2's constant): 0.2 at the first block, towards 0.8."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_index)


def lambda_parameters(module: nn.Module, width: int, layer_index: int) -> None:
    """Give `module` lambda's parameters (timm's names `lambda_q1`, `lambda_k1`, `lambda_q2`, `lambda_k2`, width d/2,
    N(0, 0.1) as the paper) and its `lambda_init` for block `layer_index`."""
    module.lambda_init = diff_lambda_init(layer_index)
    for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
        setattr(module, name, nn.Parameter(torch.randn(width) * 0.1))


def diff_lambda(m: nn.Module) -> torch.Tensor:
    """lambda (a scalar) of a module with `lambda_parameters`: exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init."""
    return (torch.exp((m.lambda_q1 * m.lambda_k1).sum().float())
            - torch.exp((m.lambda_q2 * m.lambda_k2).sum().float()) + m.lambda_init)


def differential_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: torch.Tensor,
                        mask: torch.Tensor | None, is_causal: bool, dropout_p: float, explicit: bool,
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q, k (B, 2H, N, d/2) (head h's halves at 2h and 2h + 1), v (B, H, N, d) -> (p1 - lambda p2) v (B, H, N, d)
    and, `explicit`, the differential map p1 - lambda p2 (B, H, N, N): one `attend` per half."""
    out1, p1 = attend(q[:, 0::2], k[:, 0::2], v, mask, is_causal, dropout_p, explicit)
    out2, p2 = attend(q[:, 1::2], k[:, 1::2], v, mask, is_causal, dropout_p, explicit)
    return out1 - lam * out2, (p1 - lam * p2 if p1 is not None and p2 is not None else None)


class DiffAttention(Attention):
    """Differential attention: tokens (B, N, D) -> (B, N, D), the `Attention` contract with `layer_index` (timm's
    `depth`: the block's index, which sets lambda_init). q and k have 2H heads of width d/2 (head 2h and 2h + 1
    are head h's two halves), v has H heads of width d; q / k norms (qk_norm) act on the halves."""

    feature = "diff_attention"  # its name in vit.layers.combinations

    def __init__(self, dim: int, num_heads: int = 8, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 parts: BlockParts = BlockParts(),  # noqa: B008 (frozen: one shared default is safe)
                 norm_layer: Callable[[int], nn.Module] = nn.LayerNorm, options: AttentionOptions | None = None,
                 layer_index: int = 0, **position) -> None:
        options = options or AttentionOptions()
        check_combination(diff_attention=True, sparse_attention=options.sparse_attention is not None,
                          rel_pos=position.get("rel_pos") is not None, rope=position.get("rope") is not None)
        if options.num_kv_heads not in (None, num_heads):
            raise ValueError("differential attention has one key / value head per query head (timm's); drop "
                             "num_kv_heads or use attn_layer='attn'.")
        if dim % (2 * num_heads):
            raise ValueError(f"differential attention splits each head in two: embed_dim {dim} must be divisible by "
                             f"2 x num_heads ({2 * num_heads}).")
        super().__init__(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop, parts=parts,
                         norm_layer=norm_layer, options=options)
        half = self.head_dim // 2
        self.q_norm = norm_layer(half) if options.qk_norm else nn.Identity()
        self.k_norm = norm_layer(half) if options.qk_norm else nn.Identity()
        lambda_parameters(self, half, layer_index)
        self.sub_norm = nn.RMSNorm(self.head_dim, eps=1e-5)  # per head, over its d output channels

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, is_causal: bool = False,
                return_attention: bool = False, num_queries: int | None = None, rope: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, N, D) -> (output (B, N, D) or its first `num_queries` rows, the differential map or None)."""
        check_combination(diff_attention=True, rope_table=rope is not None)
        B, N, D = x.shape
        mask, is_causal = sdpa_mask(mask, is_causal, N, N)
        q, k, v = self._project_qkv_halves(x)  # (B, 2H, N, d/2) twice, (B, H, N, d)
        q, k = self.q_norm(q), self.k_norm(k)
        out, attn = differential_attend(q, k, v, diff_lambda(self).type_as(q), mask, is_causal, self._dropout_p(),
                                        return_attention or not self.fused_attn)
        out = self.sub_norm(out) * (1 - self.lambda_init)  # (B, H, N, d)
        out = self.proj_drop(self.proj(self.norm(merge_heads(out))))
        if num_queries is not None:  # every row was computed (the halves share v): the first ones returned
            return out[:, :num_queries], None
        return out, attn

    def _project_qkv_halves(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = (self.qkv(x) if self.q_bias is None else self._project_qv_bias(x)).chunk(3, dim=-1)
        return split_heads(q, 2 * self.num_heads), split_heads(k, 2 * self.num_heads), split_heads(v, self.num_heads)

    def _project_qv_bias(self, x: torch.Tensor) -> torch.Tensor:
        return self.qkv(x) + self._qkv_bias()

    def forward_reduce(self, *args, **kwargs):
        check_combination(diff_attention=True, token_reduction=True)
