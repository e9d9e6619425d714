"""The kernels of dynamic sparse attention: attention restricted to a block selection (vit.layers.sparse_attention).

  FlexAttention block-sparse (`flex`): a `BlockMask` made straight from the selected block ids, the kernel
      compiled once per shape and cached; inference on CPU and GPU, training on GPU (no backward on CPU).
  gathered SDPA (`gathered`): each query block's kept key blocks copied side by side, then SDPA on them (a key
      mask where the last block is partial or keys are padding), a cache-sized group of query blocks at a time;
      the CPU kernel of any non-causal block selection, inference and training (SDPA has a CPU backward).
  masked SDPA (`masked_attention`): the selection as a boolean mask; CPU training, dropout, any mask; also the
      explicit softmax where the probabilities are asked for (a sparse map is a map with zeros).
Both give zeros for a query row that may see nothing (a padding query whose blocks hold only padding).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .sdpa import attend

__all__ = ["masked_attention", "flex", "gathered"]


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
    out, attn = attend(q, k, v, attn_mask, False, dropout_p, return_attention)
    if empty is not None:
        out = out.masked_fill(empty, 0.0)
        attn = None if attn is None else attn.masked_fill(empty, 0.0)
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
    (`SKIP_MASK_SCORE`: no mask call per score). Eager FlexAttention evaluates the mask function alone, ignoring
    the block lists, so there the mask function reads the selection itself."""
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


# keys gathered per SDPA call: 32,768 keys of width 64 are 8 MiB for K and for V, which stay in this CPU's L3
_GATHER_KEYS = 32768


def _key_mask(ids: torch.Tensor, counts: torch.Tensor, nb: int, num_tokens: int, S: int,
              key_valid: torch.Tensor | None, heads: int) -> torch.Tensor | None:
    """Which of the t * block_size gathered keys of each row are real, (B * H * nq, t * block_size), or None when
    all are: a key past N (the last block's tail), a padding key, a slot past the row's own count of kept blocks
    (rows keep fewer blocks where blocks of padding only are never chosen). `ids` (B, Hs, nq, t) the kept block
    ids of each row, first `counts` (B, Hs, nq) of them real."""
    B, Hs, nq, t = ids.shape
    if key_valid is None and num_tokens == nb * S and bool((counts == t).all()):
        return None
    real = torch.zeros(B, nb * S, dtype=torch.bool, device=ids.device)
    real[:, :num_tokens] = True if key_valid is None else key_valid.bool()
    blocks = real.view(B, 1, 1, nb, S).expand(B, Hs, nq, nb, S)
    ok = torch.gather(blocks, 3, ids[..., None].expand(B, Hs, nq, t, S))  # (B, Hs, nq, t, S)
    ok = ok & (torch.arange(t, device=ids.device) < counts[..., None])[..., None]
    return ok.reshape(B, Hs, nq, t * S).expand(B, heads, nq, t * S).reshape(B * heads * nq, t * S)


def gathered(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, block_size: int,
             key_valid: torch.Tensor | None = None) -> torch.Tensor:
    """Block-sparse attention by gathering, for `select="block"` without a causal mask: q, k, v (B, H, N, d),
    `keep` (B, 1 | H, nq, nb), `key_valid` (B, N) or None. Row (b, h, i) of the output is SDPA of query block i
    against its kept key blocks laid side by side (t * block_size keys, t the most any row keeps); where a key is
    not real (past N, padding, or a slot past the row's count) a key mask hides it, and a query row that may see
    nothing gives zeros, as FlexAttention does.

    Why not FlexAttention here: on this AVX2 CPU (torch 2.14.1) its template computes Q K^T with an inductor
    micro-GEMM on block-by-block tiles and ran at about half of dense SDPA's FLOP rate, while SDPA on gathered
    blocks runs near dense SDPA's (at 8,192 tokens, 1/8 density: 0.33 s of SDPA and 0.03 s of gathering per
    layer, against FlexAttention's 0.50 s and dense SDPA's 2.0 s; a key mask costs SDPA about 10% more). Without
    autograd a group of rows reuses two buffers of about `_GATHER_KEYS` keys, which stay in the cache. With
    autograd the whole selection is gathered at once (index_select and SDPA both have a CPU backward): t * N
    keys and values per head are kept for the backward (and their gradients made), against the masked
    fallback's N x N mask per selection head: less at blocks of 128 (3-4x faster there too), far more at blocks
    of 4, so `auto` uses it from `GATHER_MIN_BLOCK` up."""
    B, H, N, d = q.shape
    S, nb = block_size, keep.shape[-1]
    counts, order = block_lists(keep)
    t = int(counts.max())
    if t == 0:  # nothing kept anywhere (NaN scores, no forced block): every row sees nothing
        return q.masked_fill(torch.ones((), dtype=torch.bool, device=q.device), 0.0)
    ids = order[..., :t].long()  # (B, Hs, nq, t): the kept blocks first, ascending
    mask = _key_mask(ids, counts, nb, N, S, key_valid, H)
    if nb * S != N:  # the last block's tail: zeros, hidden by the mask, its query rows cut off below
        q, k, v = (F.pad(x, (0, 0, 0, nb * S - N)) for x in (q, k, v))
    heads = torch.arange(B * H, device=q.device).view(B, H, 1, 1) * nb
    flat = (ids.expand(B, H, nb, t) + heads).reshape(B * H * nb, t)  # rows (b, h, i)
    qf = q.reshape(B * H * nb, S, d)
    kf, vf = (x.reshape(B * H * nb, S * d) for x in (k, v))

    def attend(qs, ks, vs, m):  # qs (g, S, d), ks and vs (g, t * S, d), m (g, t * S) or None
        if m is None:
            return F.scaled_dot_product_attention(qs[None], ks[None], vs[None])[0]
        empty = ~m.any(-1)[:, None]  # rows that may see nothing: kept finite (all keys), then zeros
        o = F.scaled_dot_product_attention(qs[None], ks[None], vs[None], attn_mask=(m | empty)[None, :, None, :])
        return o[0].masked_fill(empty[..., None], 0.0)

    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        ks, vs = (x.index_select(0, flat.reshape(-1)).view(-1, t * S, d) for x in (kf, vf))
        out = attend(qf, ks, vs, mask)
    else:
        rows = max(1, _GATHER_KEYS // (t * S))
        out = torch.empty(B * H * nb, S, d, dtype=q.dtype, device=q.device)
        bk, bv = (torch.empty(min(rows, B * H * nb) * t, S * d, dtype=q.dtype, device=q.device) for _ in range(2))
        for r in range(0, B * H * nb, rows):
            ids = flat[r:r + rows].reshape(-1)
            g = ids.numel() // t
            torch.index_select(kf, 0, ids, out=bk[:g * t])
            torch.index_select(vf, 0, ids, out=bv[:g * t])
            out[r:r + g] = attend(qf[r:r + g], bk[:g * t].view(g, t * S, d), bv[:g * t].view(g, t * S, d),
                                  None if mask is None else mask[r:r + g])
    out = out.view(B, H, nb * S, d)
    return out if nb * S == N else out[:, :, :N]
