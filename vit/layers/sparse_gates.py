"""The scorers of dynamic sparse attention and the top-k block selection (vit.layers.sparse_attention runs them).

Both scorers rate a (query, key block) pair against pooled keys of the block, so that scoring costs
N x N / block_size, never N x N:
  "moba"  MoBA (Lu et al., 2025, eq. 5-6): per head, s[t, j] = q_t . mean_{s in block j} k_s.
  "dsa"   DeepSeek-V3.2-Exp's lightning indexer (DeepSeek-AI, 2025, eq. 1), token scores
              I[t, s] = sum_h w[t, h] * ReLU(q_I[t, h] . k_I[s] / sqrt(d_I)),
          pooled to key blocks by putting in place of q_I . k_I[s] its upper bound over the block's keys from
          their elementwise max and min (Quest, Tang et al., 2024): a cheap stand-in for the block's best token
          score, not diluted by the block's other keys; at block_size 1 it is the token score.
With `select="block"` a query block's scores are the mean of its queries' scores (NSA shares a selection in a
group the same way); a block-sparse kernel then skips whole tiles.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LightningIndexer", "pool_blocks", "minmax_blocks", "moba_block_scores", "select_blocks", "selection_mask",
           "rows_of", "query_block_mean"]


def pool_blocks(t: torch.Tensor, block_size: int, key_valid: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """t (B, ..., N, d) -> the mean of each block's tokens (B, ..., nb, d), padding keys (`key_valid` (B, N)
    False) left out, and which blocks hold no real token (B, nb) (None when all do). A view and one reduction
    when N is a multiple of the block and nothing is padded."""
    N, d = t.shape[-2:]
    nb = math.ceil(N / block_size)
    if key_valid is None and N % block_size == 0:
        return t.unflatten(-2, (nb, block_size)).mean(-2), None
    pad = nb * block_size - N
    valid = torch.ones(t.shape[0], N, dtype=t.dtype, device=t.device) if key_valid is None else key_valid.to(t.dtype)
    valid = F.pad(valid, (0, pad)).view(t.shape[0], *([1] * (t.dim() - 3)), nb, block_size, 1)
    count = valid.sum(-2)  # (B, 1.., nb, 1)
    pooled = (F.pad(t, (0, 0, 0, pad)).unflatten(-2, (nb, block_size)) * valid).sum(-2) / count.clamp(min=1)
    empty = (count == 0).reshape(t.shape[0], nb)
    return pooled, (empty if bool(empty.any()) else None)


def minmax_blocks(t: torch.Tensor, block_size: int, key_valid: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """t (B, N, d) -> each block's elementwise maximum and minimum over its real tokens (B, nb, d) each, and
    which blocks hold no real token (B, nb) (None when all do)."""
    B, N, d = t.shape
    nb = math.ceil(N / block_size)
    pad = nb * block_size - N
    if key_valid is None and pad == 0:
        blocks = t.unflatten(1, (nb, block_size))
        return blocks.amax(2), blocks.amin(2), None
    valid = torch.ones(B, N, dtype=torch.bool, device=t.device) if key_valid is None else key_valid.bool()
    valid = F.pad(valid, (0, pad)).view(B, nb, block_size, 1)
    blocks = F.pad(t, (0, 0, 0, pad)).unflatten(1, (nb, block_size))
    hi = blocks.masked_fill(~valid, float("-inf")).amax(2)
    lo = blocks.masked_fill(~valid, float("inf")).amin(2)
    empty = ~valid.any(2).squeeze(-1)
    if not bool(empty.any()):
        return hi, lo, None
    return hi.masked_fill(empty[..., None], 0.0), lo.masked_fill(empty[..., None], 0.0), empty


def query_block_mean(s: torch.Tensor, block_size: int) -> torch.Tensor:
    """Per-query scores (B, Hs, N, nb) -> the mean over each query block's queries (B, Hs, nq, nb); -inf stays
    -inf (a block no query may see)."""
    N = s.shape[-2]
    nq = math.ceil(N / block_size)
    if N % block_size:
        s = F.pad(s, (0, 0, 0, nq * block_size - N), value=float("nan"))
    s = s.unflatten(-2, (nq, block_size))
    return s.nanmean(-2) if N % block_size else s.mean(-2)


class LightningIndexer(nn.Module):
    """DeepSeek's lightning indexer without RoPE (our encoders add positions to the tokens). Names as in
    DeepSeek's `Indexer`: `wq` (D -> heads x head_dim; DeepSeek's `wq_b` reads the query's low-rank latent, here
    the token itself), `wk` (D -> head_dim, one key per token) with `k_norm`, and `weights_proj` (D -> heads,
    the per-token head weights, scaled by heads^-1/2). `forward` gives the token scores (B, N, N), DeepSeek's
    I[t, s]; `block_scores` the same formula against each key block's mean key (B, N, nb), what selection uses."""

    def __init__(self, dim: int, heads: int = 4, head_dim: int = 32) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.wq = nn.Linear(dim, heads * head_dim, bias=False)
        self.wk = nn.Linear(dim, head_dim, bias=False)
        self.k_norm = nn.LayerNorm(head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(dim, heads, bias=False)

    def _project(self, x: torch.Tensor):
        """The three projections as one matmul (one pass over x): q (B, N, h, d_I), k (B, N, d_I), w (B, N, h)."""
        h, d = self.heads, self.head_dim
        weight = torch.cat([self.wq.weight, self.wk.weight, self.weights_proj.weight])  # (h d + d + h, D)
        q, k, w = (x.to(weight.dtype) @ weight.T).split([h * d, d, h], -1)
        q = q.unflatten(-1, (h, d)) * d**-0.5
        return q, self.k_norm(k), w * h**-0.5  # one key per token, shared by the heads; per-token head weights

    @staticmethod
    def _score(q: torch.Tensor, keys: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """sum_h w[t, h] ReLU(q[t, h] . keys[s]): q (B, n, h, d), keys (B, M, d), w (B, n, h) -> (B, n, M)."""
        B, n, h, d = q.shape
        s = F.relu(q.reshape(B, n * h, d) @ keys.transpose(-2, -1)).view(B, n, h, -1)
        return (w.unsqueeze(-2) @ s).squeeze(-2)  # (B, n, 1, h) @ (B, n, h, M)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token scores of every query against every key: (B, N, N) (DeepSeek's I; N^2, for tests and maps)."""
        q, k, w = self._project(x)
        return self._score(q, k, w)

    def block_scores(self, x: torch.Tensor, block_size: int, key_valid: torch.Tensor | None = None) -> torch.Tensor:
        """Scores of every query against every key block: (B, N, nb), N x N / block_size work; blocks of padding
        only score -inf. Each head's q . k is replaced by its upper bound over the block's keys from their
        elementwise maximum and minimum (Quest's bound, Tang et al., 2024), sum_i max(q_i max_i, q_i min_i)
        = ReLU(q) . max - ReLU(-q) . min, so a block holding one key that scores high scores at least as high,
        however many others it holds (a mean key would dilute it by the block size)."""
        q, k, w = self._project(x)
        hi, lo, empty = minmax_blocks(k, block_size, key_valid)
        B, n, h, d = q.shape
        qf = q.reshape(B, n * h, d)
        # max(q hi, q lo) = q (hi + lo) / 2 + |q| (hi - lo) / 2, summed over the coordinates: two small matmuls
        bound = torch.baddbmm(qf @ ((hi + lo) / 2).transpose(-2, -1), qf.abs(), ((hi - lo) / 2).transpose(-2, -1))
        s = (bound.relu_().view(B, n, h, -1) * w.unsqueeze(-1)).sum(2)  # (B, n, nb)
        return s if empty is None else s.masked_fill(empty[:, None, :], float("-inf"))


def moba_block_scores(q: torch.Tensor, k: torch.Tensor, block_size: int, key_valid: torch.Tensor | None,
                      select: str) -> torch.Tensor:
    """MoBA's gate: q (B, H, N, d), k (B, H, N, d) -> (B, H, R, nb), R = N (per token) or nb (per query block:
    the block's mean query, which equals the mean of its queries' scores since the gate is linear in q). A
    block's key is the mean of its real keys (padding excluded); a block of padding only scores -inf."""
    kb, empty = pool_blocks(k, block_size, key_valid)
    if select == "block":
        q, _ = pool_blocks(q, block_size)
    scores = q @ kb.transpose(-2, -1)
    return scores if empty is None else scores.masked_fill(empty[:, None, None, :], float("-inf"))


def select_blocks(scores: torch.Tensor, topk: int, block_size: int, select: str, causal: bool,
                  own_block: bool, sink: bool) -> torch.Tensor:
    """scores (B, Hs, R, nb) -> which key blocks each row keeps, boolean (B, Hs, R, nb); row r is query token r
    (`select="token"`) or query block r. The own block (and block 0 with `sink`) always counts among the `topk`;
    with `causal`, blocks after the row's own are never kept (nor is the own block scored, when a block's mean
    would see the future: the callers mask it then). Blocks scored -inf are never kept."""
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
    val, idx = s.topk(min(topk, nb), dim=-1)
    return torch.zeros_like(s, dtype=torch.bool).scatter_(-1, idx, val > float("-inf"))


def rows_of(keep: torch.Tensor, block_size: int, num_tokens: int, select: str) -> torch.Tensor:
    """A selection (B, Hs, R, nb) -> one row per query token (B, Hs, N, nb)."""
    if select == "token":
        return keep
    return keep.repeat_interleave(block_size, dim=-2)[..., :num_tokens, :]


def selection_mask(keep: torch.Tensor, block_size: int, num_tokens: int, select: str) -> torch.Tensor:
    """Block selection (B, Hs, R, nb) -> token mask (B, Hs, N, N), True = may attend."""
    return rows_of(keep, block_size, num_tokens, select).repeat_interleave(block_size, dim=-1)[..., :num_tokens]
