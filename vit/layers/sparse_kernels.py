"""The kernels of dynamic sparse attention: attention restricted to a block selection (vit.layers.sparse_attention).

  FlexAttention block-sparse (`flex`): a `BlockMask` made straight from the selected block ids, the kernel
      compiled once per shape and cached; inference on CPU and GPU, training on GPU (no backward on CPU).
  masked SDPA (`masked_attention`): the selection as a boolean mask; CPU training, dropout, any mask; also the
      explicit softmax where the probabilities are asked for (a sparse map is a map with zeros).
Both give zeros for a query row that may see nothing (a padding query whose blocks hold only padding).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["masked_attention", "flex"]


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None,
                      bias: torch.Tensor | None, return_attention: bool,
                      dropout_p: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention restricted to `allowed` (boolean, broadcast to (B, H, N, N)) with a float `bias` added to the
    scores; rows that may see nothing (a padding query whose blocks hold only padding) give zeros, as
    FlexAttention does."""
    empty = None
    if allowed is not None:
        empty = ~allowed.any(-1, keepdim=True)  # (B|1, Hs|1, N, 1)
        allowed = allowed | empty  # keep those rows finite; zeroed below
    attn_mask = allowed
    if bias is not None:
        attn_mask = bias.to(q.dtype) if allowed is None else bias.to(q.dtype).masked_fill(~allowed, float("-inf"))
    if return_attention:
        scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool \
                else scores + attn_mask
        attn = scores.softmax(-1)
        if empty is not None:
            attn = attn.masked_fill(empty, 0.0)
        out = F.dropout(attn, dropout_p) @ v
    else:
        attn = None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
    if empty is not None:
        out = out.masked_fill(empty, 0.0)
    return out, attn


_COMPILED: dict = {}


def _flex_fn(compiled: bool):
    """FlexAttention, compiled once per process (torch.compile caches a kernel per shape and option set)."""
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    if "flex" not in _COMPILED:
        # one kernel per shape, selection layout (per head or shared) and mask: a process that meets more than
        # dynamo's default 8 (a benchmark of several models and lengths) would silently fall back to eager
        # FlexAttention, which materialises every score
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        _COMPILED["flex"] = torch.compile(flex_attention, dynamic=False)
    return _COMPILED["flex"]


def block_lists(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A selection (B, Hs, nq, nb) -> FlexAttention's kv_num_blocks (B, Hs, nq) and kv_indices (B, Hs, nq, nb):
    the kept block ids of each query block first, ascending (the rest of a row is never read)."""
    nb = keep.shape[-1]
    col = torch.arange(nb, device=keep.device, dtype=torch.int32)
    order = torch.where(keep, col, nb).sort(-1).values.clamp_(max=nb - 1)
    return keep.sum(-1, dtype=torch.int32), order


def flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, key_valid: torch.Tensor | None,
         causal: bool, block_size: int, compiled: bool) -> torch.Tensor:
    """Block-sparse FlexAttention for `select="block"`: q, k, v (B, H, N, d), `keep` (B, 1 | H, nq, nb).

    The BlockMask is made straight from the block ids (`BlockMask.from_kv_blocks`, no N x N anything;
    `create_block_mask` with a Python mask function costs as much as the attention), its transposed (query)
    lists only where a backward may follow. Every kept block is "partial": a mask of "full" blocks only fails to
    compile on this CPU, and the full-block path ran slower there. Where nothing inside a kept block is masked (no
    causal or padding mask, N a multiple of the block) the compiled CPU kernel skips the mask function
    (`SKIP_MASK_SCORE`, 1.6x faster at N = 8192, torch 2.14.1). Eager FlexAttention evaluates the mask function
    alone, ignoring the block lists, so there the mask function reads the selection itself."""
    from torch.nn.attention.flex_attention import BlockMask

    B, H, N, _ = q.shape
    Hs, nb = keep.shape[1], keep.shape[-1]
    S = block_size
    valid = None if key_valid is None else F.pad(key_valid, (0, nb * S - N))
    plain = not causal and valid is None and N % S == 0

    def mask_mod(b, h, qi, ki):
        m = ki < N
        if not compiled:
            m = m & keep[b, h if Hs > 1 else 0, qi // S, ki // S]
        if causal:
            m = m & (qi >= ki)
        if valid is not None:
            m = m & valid[b, ki]
        return m

    backward = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    q, k, v = (t.contiguous() for t in (q, k, v))
    bm = BlockMask.from_kv_blocks(*block_lists(keep), BLOCK_SIZE=S, mask_mod=mask_mod, seq_lengths=(N, N),
                                  compute_q_blocks=backward)
    options = {"SKIP_MASK_SCORE": True} if compiled and plain and q.device.type == "cpu" else None
    return _flex_fn(compiled)(q, k, v, block_mask=bm, kernel_options=options)
