"""Scaled dot-product attention, the one formula every attention layer computes (Vaswani et al., 2017, eq. 1):

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + mask) V

`attend` is its only home: the fused path (`F.scaled_dot_product_attention`, FlashAttention kernels that never
materialize the score matrix) or the explicit path, step by step, when the probabilities are asked for. Self-
attention, the decoder's cached self-attention, cross-attention and the sparse kernels' masked fallback all call
it. Masks follow SDPA's convention (boolean True = may attend; float = added to the scores) in the broadcast form
`expand_mask` gives; `split_heads` / `split_qkv` / `merge_heads` move between tokens (B, N, D) and heads
(B, H, N, d).
"""

from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F

__all__ = ["add_bias", "attend", "expand_mask", "masked_scores", "merge_heads", "sdpa_mask", "split_heads",
           "split_qkv"]


def expand_mask(mask: torch.Tensor | None, num_tokens: int) -> torch.Tensor | None:
    """Bring a user's mask into the (B | 1, 1 | H, N, N) form that attention broadcasts.

    Accepted forms, all following SDPA's convention (boolean True = may attend; float = added to the scores):
      (B, N)        a key-padding mask, e.g. a tokenizer's attention_mask (1 = real token, 0 = padding)
      (N, N)        one mask for every sample and head, e.g. a causal mask
      (B, N, N)     one mask per sample
      (B, H, N, N)  fully specified
    Integer masks are read as boolean (non-zero = may attend).
    """
    if mask is None:
        return None
    if not (mask.dtype == torch.bool or mask.is_floating_point()):
        mask = mask != 0
    if mask.dim() == 2 and mask.shape != (num_tokens, num_tokens):
        if mask.shape[-1] != num_tokens:
            raise ValueError(
                f"attention mask of shape {list(mask.shape)} does not match the {num_tokens} tokens; "
                "pass a (batch, tokens) padding mask or a (tokens, tokens) mask."
            )
        return mask[:, None, None, :]  # (B, 1, 1, N): masks keys only
    if mask.dim() == 2:
        return mask  # (N, N) broadcasts over batch and heads
    if mask.dim() == 3:
        return mask[:, None]  # (B, 1, N, N)
    if mask.dim() == 4:
        return mask
    raise ValueError(f"attention mask must have 2, 3 or 4 dimensions, got shape {list(mask.shape)}.")


def sdpa_mask(
    mask: torch.Tensor | None, is_causal: bool, num_tokens: int, num_queries: int
) -> tuple[torch.Tensor | None, bool]:
    """A user's mask and causal flag -> what SDPA takes for the first `num_queries` query rows.

    SDPA accepts a mask or is_causal, not both, so a causal constraint is folded into a given mask. A leaf for
    torch.fx (`torch.fx.wrap` where it is called): the Python branches on the mask's form stay out of traced
    graphs."""
    mask = expand_mask(mask, num_tokens)
    if mask is None:
        return None, is_causal
    if is_causal:
        causal = torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=mask.device).tril()
        mask = mask & causal if mask.dtype == torch.bool else mask.masked_fill(~causal, float("-inf"))
    if num_queries < num_tokens and mask.shape[-2] == num_tokens:
        mask = mask[..., :num_queries, :]  # (..., q, N): rows of the queries computed
    return mask, False


def add_bias(mask: torch.Tensor | None, bias: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A user's mask (any form `expand_mask` takes) with a float score bias (1 | B, H, N, N) added, e.g. a relative
    position bias: one float mask, so SDPA's fused kernel still takes it (False entries become -inf). Returned in
    the dtype the queries of tokens `x` will have (autocast's, if on), as SDPA requires. An FX leaf."""
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    mask = expand_mask(mask, bias.shape[-1])
    if mask is None:
        return bias.to(dtype)
    if mask.dtype == torch.bool:
        return bias.masked_fill(~mask, float("-inf")).to(dtype)
    return (bias + mask).to(dtype)


torch.fx.wrap("add_bias")


def masked_scores(scores: torch.Tensor, mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
    """Apply an `sdpa_mask` result to explicit scores (B, H, Nq, Nk), as SDPA would. An FX leaf, like sdpa_mask."""
    if is_causal:
        n = scores.shape[-1]
        causal = torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return scores


torch.fx.wrap("masked_scores")


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    explicit: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q k^T / sqrt(d) + mask) v for q (B, H, Nq, d) and k, v (B, H, Nk, d): the fused SDPA call, or with
    `explicit` the step-by-step path that also returns the probabilities (B, H, Nq, Nk) (before dropout).
    `mask` is in `expand_mask`'s broadcast form; `is_causal` is SDPA's (top-left aligned).
    Returns (out (B, H, Nq, d), probabilities or None)."""
    if not explicit:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal), None
    scores = masked_scores((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1), mask, is_causal)  # (B, H, Nq, Nk)
    attn = scores.softmax(dim=-1)
    out = F.dropout(attn, dropout_p) @ v if dropout_p > 0 else attn @ v
    return out, attn


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, N, H*d) -> (B, H, N, d)."""
    B, N, D = x.shape
    return x.reshape(B, N, num_heads, D // num_heads).transpose(1, 2)


def split_qkv(x: torch.Tensor, num_heads: int, parts: int = 3) -> list[torch.Tensor]:
    """A fused projection's output (B, N, parts*H*d), e.g. `qkv` (parts=3) or a memory's `kv` (parts=2) ->
    `parts` tensors (B, H, N, d): a view and a permute, no copy."""
    B, N, D = x.shape
    return x.reshape(B, N, parts, num_heads, D // (parts * num_heads)).permute(2, 0, 3, 1, 4).unbind(0)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, N, d) -> (B, N, H*d): heads side by side again."""
    B, H, N, d = x.shape
    return x.transpose(1, 2).reshape(B, N, H * d)
