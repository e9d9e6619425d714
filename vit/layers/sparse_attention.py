"""Dynamic sparse attention: each query attends only to the top-k key blocks that a cheap scorer picks.

Keys are cut into blocks of `block_size` tokens. A scorer rates every (query, key block) pair, the top
`topk_blocks` blocks are kept (the query's own block and, optionally, the first block as a sink always among
them), and softmax(Q K^T / sqrt(d)) V runs on the kept blocks only; a kept block is attended exactly.

Scorers:
  "moba"  MoBA (Lu et al., 2025, "MoBA: Mixture of Block Attention for Long-Context LLMs", eq. 5-6): a
          parameter-free gate per head, s[t, j] = q_t . mean_{s in block j} k_s.
  "dsa"   DeepSeek-V3.2-Exp's lightning indexer (DeepSeek-AI, 2025, eq. 1), a learned submodule with a few small
          heads, one key per token shared by the heads and per-token head weights,
              I[t, s] = sum_j w[t, j] * ReLU(q_I[t, j] . k_I[s] / sqrt(d_I)),
          shared by all attention heads and pooled to key blocks by its maximum over the block's keys.
Granularity (`select`): "token" gives every query its own blocks (the published semantics of both; run by a
masked kernel, exact but without a block-kernel speed-up, since the queries of a block together touch nearly
every block); "block" shares one selection among the `block_size` queries of a block (scores averaged over
them, as NSA shares its selection in a group), which FlexAttention's block-sparse kernel turns into skipped tiles.

Kernels: FlexAttention with a `BlockMask` made straight from the top-k indices (inference on CPU and GPU,
training on GPU; FlexAttention has no backward on CPU); SDPA with the selection as a boolean mask (training on
CPU, any mask, dropout; the same numbers); the explicit softmax where the probabilities are asked for (a sparse
map is a map with zeros, so rollout works). Causal and padding masks compose with the selection: a future or
padded key is never scored nor attended. Below `min_tokens` (the measured crossover) attention stays dense.

Training the indexer follows DeepSeek's two stages (`set_indexer_stage`): "warmup" keeps attention dense and
teaches the indexer the dense attention's distribution, KL(p_t || softmax(I_t)) with p_t the attention summed
over heads (the caller freezes the rest of the model); "sparse" attends sparsely, the indexer's input detached,
its KL restricted to the selected keys. The loss of the last forward is `indexer_loss(model)`.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "METHODS", "SELECTS", "LightningIndexer", "SparseAttention", "select_blocks", "selection_mask",
    "moba_block_scores", "indexer_loss", "sparse_kwargs", "parse_sparse_spec", "retune", "set_indexer_stage",
    "sparse_modules", "indexer_schedule", "check_sparse_options",
]

METHODS = ("dsa", "moba")
SELECTS = ("token", "block")
STAGES = (None, "warmup", "sparse")
# A method's defaults, where the user leaves an option at None: MoBA keeps the query's own block and no sink and
# selects per token (its published gate); DSA here selects per query block (what the kernel accelerates) and keeps
# the first block, where [CLS] sits, as a sink.
DEFAULTS = {"moba": dict(select="token", own_block=True, sink=False),
            "dsa": dict(select="block", own_block=True, sink=True)}
# The sequence length below which dense SDPA is at least as fast (benchmark.py --sparse-attention, 2-core CPU,
# ViT-B width, blocks of 128, 1/8 density): MoBA's layer beat dense from 1024 tokens (1.14x; 1.46x at 2048).
# DSA's exact token scoring is N^2 and memory-bound, so on that CPU it did not beat dense at any length measured.
CROSSOVER_TOKENS = 1024
_WARNED = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, stacklevel=3)


class LightningIndexer(nn.Module):
    """DeepSeek's lightning indexer without RoPE (our encoders add positions to the tokens): x (B, N, D) ->
    token scores I (B, N, N). Names as in DeepSeek's `Indexer`: `wq` (D -> heads x head_dim, DeepSeek's `wq_b`
    reads the query's low-rank latent; here the token itself), `wk` (D -> head_dim, one key per token) with
    `k_norm`, and `weights_proj` (D -> heads, the per-token head weights, scaled by heads^-1/2)."""

    def __init__(self, dim: int, heads: int = 4, head_dim: int = 32) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.wq = nn.Linear(dim, heads * head_dim, bias=False)
        self.wk = nn.Linear(dim, head_dim, bias=False)
        self.k_norm = nn.LayerNorm(head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(dim, heads, bias=False)

    def forward(self, x: torch.Tensor, rows: slice | None = None) -> torch.Tensor:
        """Scores of the query rows `rows` (default all) against every key: (B, n, N). One head at a time, so
        that no (B, heads, n, N) tensor exists; in place where no gradient is needed."""
        xq = x if rows is None else x[:, rows]
        q = self.wq(xq).unflatten(-1, (self.heads, self.head_dim)) * self.head_dim**-0.5  # (B, n, h, d_I)
        kt = self.k_norm(self.wk(x)).transpose(-2, -1)  # (B, d_I, N): one key per token, shared by the heads
        w = self.weights_proj(xq) * self.heads**-0.5  # (B, n, h)
        grad = torch.is_grad_enabled()
        out = None
        for j in range(self.heads):
            s = q[:, :, j] @ kt  # (B, n, N); ReLU(c a) = c ReLU(a) for the scale c > 0
            if grad:
                s = F.relu(s) * w[:, :, j, None]
                out = s if out is None else out + s
            else:
                s = s.relu_()
                out = s.mul_(w[:, :, j, None]) if out is None else out.addcmul_(s, w[:, :, j, None])
        return out


def moba_block_scores(q: torch.Tensor, k: torch.Tensor, block_size: int, key_valid: torch.Tensor | None,
                      select: str) -> torch.Tensor:
    """MoBA's gate: q (B, H, N, d), k (B, H, N, d) -> (B, H, R, nb), R = N (per token) or nb (per query block,
    the block's mean query). A block's key is the mean of its real keys (padding excluded)."""
    B, H, N, d = k.shape
    nb = math.ceil(N / block_size)
    pad = nb * block_size - N
    valid = torch.ones(B, N, dtype=k.dtype, device=k.device) if key_valid is None else key_valid.to(k.dtype)
    valid = F.pad(valid, (0, pad)).view(B, 1, nb, block_size, 1)
    kb = (F.pad(k, (0, 0, 0, pad)).view(B, H, nb, block_size, d) * valid).sum(3)
    kb = kb / valid.sum(3).clamp(min=1)  # (B, H, nb, d)
    if select == "block":  # the mean query of each query block
        counts = (N - torch.arange(nb, device=q.device) * block_size).clamp(max=block_size).to(q.dtype)
        q = F.pad(q, (0, 0, 0, pad)).view(B, H, nb, block_size, d).sum(3) / counts[:, None]
    scores = q @ kb.transpose(-2, -1)
    empty = (valid.sum(3) == 0).view(B, 1, 1, nb)  # a block of padding only is never chosen
    return scores.masked_fill(empty, float("-inf"))


def select_blocks(scores: torch.Tensor, topk: int, block_size: int, select: str, causal: bool,
                  own_block: bool, sink: bool) -> torch.Tensor:
    """scores (B, Hs, R, nb) -> which key blocks each row keeps, boolean (B, Hs, R, nb); row r is query token r
    (`select="token"`) or query block r. The own block (and block 0 with `sink`) always counts among the `topk`;
    with `causal`, blocks after the row's own are never kept (nor is the own block scored, when MoBA's mean of a
    block would see the future: the callers mask it then). Blocks scored -inf are never kept."""
    R, nb = scores.shape[-2:]
    row = torch.arange(R, device=scores.device)
    own = row // block_size if select == "token" else row  # (R,) each row's own block
    col = torch.arange(nb, device=scores.device)
    s = scores.float()
    if causal:
        s = s.masked_fill(col[None, :] > own[:, None], float("-inf"))
    forced = torch.zeros(R, nb, dtype=torch.bool, device=scores.device)
    if own_block:
        forced |= col[None, :] == own[:, None]
    if sink:
        forced[:, 0] = True
    s = s.masked_fill(forced, float("inf"))
    k = min(topk, nb)
    val, idx = s.topk(k, dim=-1)
    keep = torch.zeros_like(s, dtype=torch.bool).scatter_(-1, idx, val > float("-inf"))
    return keep


def selection_mask(keep: torch.Tensor, block_size: int, num_tokens: int, select: str) -> torch.Tensor:
    """Block selection (B, Hs, R, nb) -> token mask (B, Hs, N, N), True = may attend."""
    m = keep.repeat_interleave(block_size, dim=-1)[..., :num_tokens]
    if select == "block":
        m = m.repeat_interleave(block_size, dim=-2)[..., :num_tokens, :]
    return m


def _split_mask(mask: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """A mask in `expand_mask`'s (B|1, 1|H, N, N) form -> (key_valid (B, N) for a boolean key-padding mask,
    the boolean mask, the float mask), each None where absent."""
    if mask is None:
        return None, None, None
    if mask.dtype != torch.bool:
        return None, None, mask
    key_valid = mask[:, 0, 0] if mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == 1 else None
    return key_valid, mask, None


class SparseAttention(nn.Module):
    """The sparse core of `Attention`: q, k, v (B, H, N, d) and the layer's input x (B, N, D) -> the attention
    output (B, H, N, d) and, when asked, the probabilities (B, H, N, N) with zeros off the selection.

    Args:
        method: "dsa" (learned indexer) or "moba" (parameter-free gate).
        dim, num_heads: the layer's width and heads (the indexer reads x).
        block_size: tokens per key (and query) block.
        topk_blocks: key blocks kept per query row, forced blocks included; or
        density: the kept share of blocks (topk = ceil(density * blocks)); one of the two, default 1/8.
        select: "token" or "block" (see the module docstring); None: the method's default.
        own_block, sink: always keep the query's own block / block 0; None: the method's default.
        min_tokens: below this many tokens attention stays dense (None: `CROSSOVER_TOKENS`; 0: always sparse).
    """

    def __init__(self, method: str, dim: int, num_heads: int, block_size: int = 128, topk_blocks: int | None = None,
                 density: float | None = None, select: str | None = None, own_block: bool | None = None,
                 sink: bool | None = None, min_tokens: int | None = None) -> None:
        super().__init__()
        check_sparse_options(method, block_size, topk_blocks, density, select)
        d = DEFAULTS[method]
        self.method, self.block_size = method, block_size
        self.topk_blocks, self.density = topk_blocks, (0.125 if topk_blocks is None and density is None else density)
        self.select = d["select"] if select is None else select
        self.own_block = d["own_block"] if own_block is None else own_block
        self.sink = d["sink"] if sink is None else sink
        self.min_tokens = CROSSOVER_TOKENS if min_tokens is None else min_tokens
        self.indexer = LightningIndexer(dim, heads=4, head_dim=min(32, dim)) if method == "dsa" else None
        self.kernel = "auto"  # "auto" | "flex" | "sdpa"; auto: flex where it has a backward or none is needed
        self.compile_flex = True  # False: FlexAttention eager (tests; it is a dense reference computation then)
        self.stage: str | None = None  # set_indexer_stage: None, "warmup" or "sparse"
        self.last_loss: torch.Tensor | None = None

    def extra_repr(self) -> str:
        k = f"topk_blocks={self.topk_blocks}" if self.topk_blocks is not None else f"density={self.density}"
        return (f"{self.method}, block_size={self.block_size}, {k}, select={self.select}, own_block={self.own_block}, "
                f"sink={self.sink}, min_tokens={self.min_tokens}")

    def topk(self, num_tokens: int) -> int:
        nb = math.ceil(num_tokens / self.block_size)
        return self.topk_blocks if self.topk_blocks is not None else max(1, math.ceil(self.density * nb))

    def applies(self, num_tokens: int) -> bool:
        """Whether attention over `num_tokens` runs sparse; dense below the crossover (said once)."""
        if self.stage == "warmup":
            return True  # dense attention, but the indexer must see it
        if num_tokens < self.min_tokens:
            _warn_once("crossover", f"sparse attention runs dense below {self.min_tokens} tokens (got {num_tokens}), "
                       "where dense SDPA is faster; pass min_tokens=0 to force it.")
            return False
        return True

    @torch.no_grad()
    def block_scores(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, key_valid: torch.Tensor | None,
                     causal: bool) -> torch.Tensor:
        """(B, Hs, R, nb) scores of the key blocks: Hs = H for MoBA (per head), 1 for DSA (shared)."""
        if self.method == "moba":
            s = moba_block_scores(q.float(), k.float(), self.block_size, key_valid, self.select)
            return s
        return self._indexer_block_scores(x, key_valid, causal)[:, None]

    def _indexer_block_scores(self, x: torch.Tensor, key_valid: torch.Tensor | None, causal: bool) -> torch.Tensor:
        """The indexer's token scores pooled to key blocks (max over a block's keys), and for `select="block"` to
        query blocks (mean over a block's queries); computed a few query blocks at a time: (B, R, nb)."""
        B, N, _ = x.shape
        S = self.block_size
        nb = math.ceil(N / S)
        step = S * max(1, 1024 // S)  # query rows per chunk: a (B, 1024, N) score slab at most
        out = []
        for r0 in range(0, N, step):
            r1 = min(N, r0 + step)
            s = self.indexer(x.to(self.indexer.wq.weight.dtype), slice(r0, r1))  # (B, n, N)
            s = self._mask_token_scores(s, key_valid, causal, r0)
            if N % S:
                s = F.pad(s, (0, nb * S - N), value=float("-inf"))
            s = s.view(B, r1 - r0, nb, S).amax(-1)  # (B, n, nb)
            if self.select == "block":
                n = r1 - r0
                nq = math.ceil(n / S)
                s = F.pad(s, (0, 0, 0, nq * S - n), value=0.0).view(B, nq, S, nb)
                counts = torch.clamp(n - torch.arange(nq, device=s.device) * S, max=S).to(s.dtype)
                fin = torch.isfinite(s)
                total = s.masked_fill(~fin, 0).sum(2) / counts[:, None]  # mean of the finite scores
                s = total.masked_fill(~fin.any(2), float("-inf"))
            out.append(s)
        return torch.cat(out, dim=1)

    @staticmethod
    def _mask_token_scores(s: torch.Tensor, key_valid: torch.Tensor | None, causal: bool, r0: int = 0) -> torch.Tensor:
        """-inf where a query row (r0 + i) may not see a key: padding keys; with `causal`, later keys."""
        if key_valid is not None:
            s = s.masked_fill(~key_valid[:, None, :], float("-inf"))
        if causal:
            rows = torch.arange(r0, r0 + s.shape[1], device=s.device)[:, None]
            s = s.masked_fill(torch.arange(s.shape[-1], device=s.device)[None, :] > rows, float("-inf"))
        return s

    def forward(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None, is_causal: bool, return_attention: bool,
                dropout_p: float) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, N, D) the layer's input (the indexer reads it); q, k, v (B, H, N, d); `mask` in `expand_mask`'s
        form or None. Returns (output (B, H, N, d), probabilities (B, H, N, N) or None)."""
        N = q.shape[2]
        key_valid, allowed, bias = _split_mask(mask)
        if is_causal:
            tri = torch.ones(N, N, dtype=torch.bool, device=q.device).tril()
            allowed = tri if allowed is None else allowed & tri
        keep = None  # warm-up: dense attention, the indexer learns its distribution
        if self.stage != "warmup":
            scores = self.block_scores(x, q, k, key_valid, is_causal)
            if self.method == "moba" and is_causal and not self.own_block:
                scores = self._hide_own(scores)  # a mean over the own block would read the future
            keep = select_blocks(scores, self.topk(N), self.block_size, self.select, is_causal, self.own_block,
                                 self.sink)
        self.last_loss = None
        if self.stage is not None and self.indexer is not None:
            self.last_loss = self._indexer_kl(x, q, k, allowed, bias, keep)
        if keep is not None and self._use_flex(q, mask, key_valid, return_attention, dropout_p):
            return _flex(q, k, v, keep, key_valid, is_causal, self.block_size, self.compile_flex), None
        if keep is not None:
            sel = selection_mask(keep, self.block_size, N, self.select)
            allowed = sel if allowed is None else sel & allowed
        return _masked_attention(q, k, v, allowed, bias, return_attention, dropout_p)

    def _hide_own(self, scores: torch.Tensor) -> torch.Tensor:
        R, nb = scores.shape[-2:]
        own = torch.arange(R, device=scores.device) // (self.block_size if self.select == "token" else 1)
        return scores.masked_fill(own[:, None] == torch.arange(nb, device=scores.device)[None, :], float("-inf"))

    def _use_flex(self, q: torch.Tensor, mask: torch.Tensor | None, key_valid: torch.Tensor | None,
                  return_attention: bool, dropout_p: float) -> bool:
        if self.kernel != "auto":
            return self.kernel == "flex"
        if return_attention or dropout_p > 0 or self.select != "block":
            return False
        if mask is not None and key_valid is None:  # masks other than key padding: composed densely
            return False
        needs_grad = torch.is_grad_enabled() and q.requires_grad
        return not (needs_grad and q.device.type == "cpu")  # FlexAttention has no backward on CPU

    def _indexer_kl(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor | None,
                    bias: torch.Tensor | None, keep: torch.Tensor | None) -> torch.Tensor:
        """DeepSeek's indexer loss, the mean over queries of KL(p_t || softmax(I_t)): p the dense attention summed
        over heads and L1-normalised (a target: no gradient), I the indexer's scores of the detached input. In
        the sparse stage (`keep` given) both are restricted to the selected keys."""
        N = x.shape[1]
        if keep is not None:
            sel = selection_mask(keep, self.block_size, N, self.select)  # (B, 1, N, N)
            allowed = sel if allowed is None else sel & allowed
        with torch.no_grad():
            logits = (q.float() * q.shape[-1] ** -0.5) @ k.float().transpose(-2, -1)  # (B, H, N, N)
            if bias is not None:
                logits = logits + bias.float()
            if allowed is not None:
                logits = logits.masked_fill(~allowed, float("-inf"))
            p = torch.nan_to_num(logits.softmax(-1)).sum(1)  # (B, N, N), summed over heads
            p = p / p.sum(-1, keepdim=True).clamp(min=1e-12)
        score = self.indexer(x.detach().to(self.indexer.wq.weight.dtype)).float()  # (B, N, N)
        if allowed is not None:
            rows = allowed.any(1) if allowed.dim() == 4 else allowed  # where any head may attend
            score = score.masked_fill(~rows, float("-inf"))
        logq = torch.log_softmax(score, -1)
        kl = torch.xlogy(p, p) - torch.where(p > 0, p * logq, torch.zeros_like(p))
        return kl.sum(-1).mean()


def _masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None,
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


_COMPILED = {}


def _flex_fn(compiled: bool):
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    if "flex" not in _COMPILED:
        _COMPILED["flex"] = torch.compile(flex_attention, dynamic=False)
    return _COMPILED["flex"]


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, key_valid: torch.Tensor | None,
          causal: bool, block_size: int, compiled: bool) -> torch.Tensor:
    """Block-sparse FlexAttention for `select="block"`: the kept blocks of each query block, sorted, become the
    BlockMask's kv indices (`BlockMask.from_kv_blocks`, milliseconds; `create_block_mask` with a Python mask
    function costs as much as the attention). Every kept block is "partial" (its mask function applied): on this
    CPU that ran 2.6x faster than marking the unmasked ones "full" (N = 4096, 12 heads, blocks of 128, torch
    2.14.1), and a mask of full blocks only fails to compile there. Eager FlexAttention evaluates the mask
    function alone, ignoring the block lists, so there the mask function reads the selection itself."""
    from torch.nn.attention.flex_attention import BlockMask

    B, H, N, _ = q.shape
    Hs, nb = keep.shape[1], keep.shape[-1]
    S = block_size
    valid = None if key_valid is None else F.pad(key_valid, (0, nb * S - N))
    col = torch.arange(nb, device=q.device)

    def indices(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        order = torch.where(m, col, nb).sort(-1).values.clamp(max=nb - 1)  # kept block ids first, ascending
        return m.sum(-1, dtype=torch.int32), order.to(torch.int32)

    def mask_mod(b, h, qi, ki):
        m = ki < N
        if not compiled:
            m = m & keep[b, h if Hs > 1 else 0, qi // S, ki // S]
        if causal:
            m = m & (qi >= ki)
        if valid is not None:
            m = m & valid[b, ki]
        return m

    bm = BlockMask.from_kv_blocks(*indices(keep), BLOCK_SIZE=S, mask_mod=mask_mod, seq_lengths=(N, N))
    return _flex_fn(compiled)(q, k, v, block_mask=bm)


def check_sparse_options(method: str | None, block_size: int = 128, topk_blocks: int | None = None,
                         density: float | None = None, select: str | None = None) -> None:
    """Raise ValueError with one sentence for a bad sparse-attention option."""
    if method is None:
        return
    if method not in METHODS:
        raise ValueError(f"unknown sparse_attention {method!r}; choose 'dsa' or 'moba' (or None for dense).")
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"sparse block_size must be a positive integer, got {block_size!r}.")
    if topk_blocks is not None and density is not None:
        raise ValueError("pass either topk_blocks or density for sparse attention, not both.")
    if topk_blocks is not None and (not isinstance(topk_blocks, int) or topk_blocks < 1):
        raise ValueError(f"sparse topk_blocks must be a positive integer, got {topk_blocks!r}.")
    if density is not None and not 0 < density <= 1:
        raise ValueError(f"sparse density must be in (0, 1], got {density!r}.")
    if select is not None and select not in SELECTS:
        raise ValueError(f"unknown sparse_select {select!r}; choose 'token' or 'block'.")


def sparse_kwargs(method: str | None, block_size: int = 128, topk_blocks: int | None = None,
                  density: float | None = None, select: str | None = None, own_block: bool | None = None,
                  sink_block: bool | None = None, min_tokens: int | None = None) -> dict | None:
    """A model's `sparse_*` options -> the keyword arguments of `Attention` (None: dense), checked here so that a
    bad value fails once, with its sentence, before any block is built."""
    check_sparse_options(method, block_size, topk_blocks, density, select)
    if method is None:
        return None
    return dict(sparse_attention=method, block_size=block_size, topk_blocks=topk_blocks, density=density,
                sparse_select=select, keep_own_block=own_block, sink_block=sink_block, min_tokens=min_tokens)


def parse_sparse_spec(spec: str) -> dict:
    """A command line's "METHOD[:DENSITY][:SELECT]" ("moba", "dsa:0.125:block", "none") -> set_sparse_attention's
    keywords {method, density, select}; a bad spec raises ValueError with one sentence."""
    parts = spec.strip().split(":")
    method = None if parts[0] in ("none", "") else parts[0]
    out: dict = dict(method=method, density=None, select=None)
    try:
        if len(parts) > 1 and parts[1]:
            out["density"] = float(parts[1])
    except ValueError:
        raise ValueError(f"sparse attention spec {spec!r}: the density {parts[1]!r} is not a number; write e.g. "
                         "dsa:0.125:block.") from None
    if len(parts) > 2:
        out["select"] = parts[2]
    if len(parts) > 3 or (method is None and len(parts) > 1):
        raise ValueError(f"sparse attention spec {spec!r} has too many parts; write METHOD[:DENSITY][:SELECT], "
                         "e.g. dsa:0.125:block, or none.")
    check_sparse_options(method, 128, None, out["density"], out["select"])
    return out


def retune(current: SparseAttention | None, method: str | None, dim: int, num_heads: int,
           density: float | None = None, topk_blocks: int | None = None, select: str | None = None,
           min_tokens: int | None = None) -> SparseAttention | None:
    """A layer's sparse core with other selection options, weights kept (evaluation and benchmarks): the indexer
    of a "dsa" layer is carried over; a dense layer may become "moba" (no weights) but not "dsa" (untrained)."""
    if method is None:
        return None
    if method == "dsa" and (current is None or current.indexer is None):
        raise ValueError("this model has no trained DSA indexer; train it with model.sparse_attention=dsa, or "
                         "evaluate with the parameter-free moba.")
    base = dict(block_size=128, topk_blocks=None, density=None, select=None, own_block=None, sink=None,
                min_tokens=None)
    if current is not None:
        base.update(block_size=current.block_size, topk_blocks=current.topk_blocks, density=current.density,
                    min_tokens=current.min_tokens)
        if current.method == method:
            base.update(select=current.select, own_block=current.own_block, sink=current.sink)
    if density is not None or topk_blocks is not None:
        base.update(density=density, topk_blocks=topk_blocks)
    base.update({k: v for k, v in dict(select=select, min_tokens=min_tokens).items() if v is not None})
    new = SparseAttention(method, dim, num_heads, **base)
    if method == "dsa":
        new.indexer = current.indexer
    if current is not None:
        new.kernel, new.compile_flex = current.kernel, current.compile_flex
    return new.to(next(iter(current.parameters()), torch.empty(0)).device) if current is not None else new


def sparse_modules(model: nn.Module) -> list[SparseAttention]:
    return [m for m in model.modules() if isinstance(m, SparseAttention)]


def set_indexer_stage(model: nn.Module, stage: str | None) -> None:
    """DeepSeek's indexer training stage for every sparse layer: "warmup" (dense attention, the indexer learns it;
    freeze the rest yourself), "sparse" (sparse attention, the indexer keeps learning on the selection) or None
    (no indexer loss)."""
    if stage not in STAGES:
        raise ValueError(f"unknown indexer stage {stage!r}; choose 'warmup', 'sparse' or None.")
    for m in sparse_modules(model):
        m.stage = stage


def indexer_schedule(model: nn.Module, step: int, warmup_steps: int) -> str | None:
    """DeepSeek's two stages by optimizer step, for a training loop: "warmup" for the first `warmup_steps` (only
    the indexers learn: every other parameter is frozen, then restored), then "sparse"; None for a model with
    no DSA layer (nothing changes). Returns the stage, which also says what the loss is (`indexer_loss`)."""
    layers = [m for m in sparse_modules(model) if m.indexer is not None]
    if not layers:
        return None
    stage = "warmup" if step < warmup_steps else "sparse"
    if layers[0].stage != stage:
        indexer = {id(p) for m in layers for p in m.indexer.parameters()}
        for p in model.parameters():
            if id(p) in indexer:
                continue
            if stage == "warmup":
                p._frozen_for_indexer = p.requires_grad  # what to restore
                p.requires_grad_(False)
            elif hasattr(p, "_frozen_for_indexer"):
                p.requires_grad_(p._frozen_for_indexer)
                del p._frozen_for_indexer
        set_indexer_stage(model, stage)
    return stage


def indexer_loss(model: nn.Module) -> torch.Tensor | None:
    """Sum over sparse layers of the last forward's indexer KL, or None when no layer computed one."""
    losses = [m.last_loss for m in sparse_modules(model) if m.last_loss is not None]
    return torch.stack(losses).sum() if losses else None
