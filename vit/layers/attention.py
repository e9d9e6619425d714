"""Multi-head self-attention (Vaswani et al., 2017, "Attention Is All You Need", eq. 1 and section 3.2.2).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Q, K and V come from one fused Linear (`qkv`, D -> 3D) so the three projections are a single matmul, named as
in timm so that timm weights load unchanged. The fused path calls `F.scaled_dot_product_attention`, which
dispatches to FlashAttention kernels (on CPU `_scaled_dot_product_flash_attention_for_cpu`) and never
materializes the (N, N) score matrix. The explicit path computes softmax(QK^T/sqrt(d))V step by step and is
used only when a caller asks for the attention probabilities, for inspection and attention rollout.
With `sparse_attention="dsa" | "moba"` each query attends only to the top-k key blocks a scorer picks
(vit.layers.sparse_attention, which holds the scorers and kernels; this module only dispatches to it).

For a decoder (section 3.2.3): `CachedSelfAttention` is `Attention` run step by step over cached keys and values,
and `CrossAttention` takes its queries from the decoder and its keys and values from an encoder's memory; both
go through `attend`, the same fused-or-explicit softmax(QK^T/sqrt(d))V with `expand_mask`'s convention.
"""

from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from .sparse_attention import SparseAttention

__all__ = ["Attention", "CachedSelfAttention", "CrossAttention", "attend", "expand_mask", "masked_scores",
           "merge_heads", "sdpa_mask", "split_heads"]


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
    torch.fx (`torch.fx.wrap` below): the Python branches on the mask's form stay out of traced graphs."""
    mask = expand_mask(mask, num_tokens)
    if mask is None:
        return None, is_causal
    if is_causal:
        causal = torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=mask.device).tril()
        mask = mask & causal if mask.dtype == torch.bool else mask.masked_fill(~causal, float("-inf"))
    if num_queries < num_tokens and mask.shape[-2] == num_tokens:
        mask = mask[..., :num_queries, :]  # (..., q, N): rows of the queries computed
    return mask, False


def masked_scores(scores: torch.Tensor, mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
    """Apply an `sdpa_mask` result to explicit scores (B, H, N, N), as SDPA would. An FX leaf, like sdpa_mask."""
    if is_causal:
        n = scores.shape[-1]
        causal = torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return scores


torch.fx.wrap("sdpa_mask")
torch.fx.wrap("masked_scores")


class Attention(nn.Module):
    """Multi-head self-attention with a fused QKV projection: tokens (B, N, D) -> (B, N, D), plus the attention
    probabilities (B, H, N, N) when asked (the explicit path). Each of the H heads attends with width D / H;
    masks take any form `expand_mask` accepts, and `num_queries=q` computes the first q queries only (B, q, D).

    Args:
        dim: token width D.
        num_heads: number of heads H; D must be divisible by H (head width D / H).
        qkv_bias: add a bias to the QKV projection (ViT and BERT do).
        attn_drop: dropout on the attention probabilities.
        proj_drop: dropout after the output projection.
        fused_attn: use `F.scaled_dot_product_attention` (default); False selects the explicit path always.
        sparse_attention: None (dense), "dsa" or "moba": top-k key blocks per query (vit.layers.sparse_attention,
            whose `SparseAttention` documents the options `block_size`, `topk_blocks` or `density`,
            `sparse_select` ("token" | "block"), `keep_own_block`, `sink_block` and `min_tokens`).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        fused_attn: bool = True,
        sparse_attention: str | None = None,
        block_size: int = 128,
        topk_blocks: int | None = None,
        density: float | None = None,
        sparse_select: str | None = None,
        keep_own_block: bool | None = None,
        sink_block: bool | None = None,
        min_tokens: int | None = None,
    ) -> None:
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(
                f"embed_dim {dim} is not divisible by num_heads {num_heads}; choose a head count that divides it."
            )
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused_attn = fused_attn
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.sparse = None if sparse_attention is None else SparseAttention(
            sparse_attention, dim, num_heads, block_size, topk_blocks, density, sparse_select, keep_own_block,
            sink_block, min_tokens)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        return_attention: bool = False,
        num_queries: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, N, D). mask: see `expand_mask`. Returns (output (B, N, D), probabilities (B, H, N, N) or None).

        `num_queries=q` computes the output of the first q tokens only (all N tokens still serve as keys and
        values): (B, q, D). A classifier that reads only [CLS] needs nothing else from its last layer.
        Masks are prepared by `sdpa_mask` (an FX leaf), so `mask` and `is_causal` meet no Python branch here
        and the module traces with torch.fx as well as it scripts."""
        B, N, D = x.shape
        if not torch.jit.is_scripting():  # TorchScript compiles the dense layer only
            if self.sparse is not None and num_queries is None and self.sparse.applies(N):
                return self._sparse_forward(x, mask, is_causal, return_attention)
            if self.sparse is not None:
                self.sparse.last_loss = None  # dense this time: no indexer KL (a stale one would be summed again)
        if num_queries is not None:  # a few queries (the [CLS] of a last block) attend densely: O(N) anyway
            mask, is_causal = sdpa_mask(mask, is_causal, N, num_queries)
            return self._first_queries(x, num_queries, mask, is_causal), None
        mask, is_causal = sdpa_mask(mask, is_causal, N, N)
        # (B, N, 3D) -> (3, B, H, N, d): one matmul for Q, K and V, then a view and a permute (no copy).
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

        attn: torch.Tensor | None = None
        if self.fused_attn and not return_attention:
            x = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                dropout_p=self.attn_drop.p if self.training else 0.0,
                is_causal=is_causal,
            )
        else:
            scores = masked_scores((q * self.scale) @ k.transpose(-2, -1), mask, is_causal)  # (B, H, N, N)
            attn = scores.softmax(dim=-1)
            x = self.attn_drop(attn) @ v  # (B, H, N, d)

        x = x.transpose(1, 2).reshape(B, N, D)  # (B, N, H*d): heads side by side again
        x = self.proj_drop(self.proj(x))
        return x, attn

    @torch.jit.unused
    def _sparse_forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, is_causal: bool, return_attention: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`forward` through the sparse core: the same projections, attention on the selected key blocks."""
        B, N, D = x.shape
        q, k, v = self._qkv(x)
        p = self.attn_drop.p if self.training else 0.0
        out, attn = self.sparse(x, q, k, v, expand_mask(mask, N), is_causal, return_attention, p)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, N, D))), attn

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, N, D) -> q, k, v (B, H, N, d) each."""
        B, N, _ = x.shape
        # (B, N, 3D) -> (3, B, H, N, d): one matmul for Q, K and V, then a view and a permute (no copy).
        return self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def forward_reduce(
        self,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        need: str | None = None,
        return_attention: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Attention for token reduction (vit.layers.token_reduction): x (B, N, D), bias (B, 1, 1, N) a float
        mask added to the logits (ToMe's log token sizes) or None. Returns (output (B, N, D), probabilities
        (B, H, N, N) or None, what `need` asks for):
          'keys': the keys averaged over heads (B, N, d), ToMe's matching metric;
          'cls':  the [CLS] row of the probabilities (B, H, 1, N), EViT's ranking. On the fused path it is one
                  extra (1 x N) product per head beside the fused kernel, O(N d) instead of the N x N map."""
        B, N, D = x.shape
        q, k, v = self._qkv(x)
        bias = None if bias is None else bias.to(q.dtype)
        if bias is not None and torch.compiler.is_exporting():  # (B, 1, 1, N) -> (B, 1, N, N): ONNX Runtime's
            bias = bias.expand(-1, -1, N, -1)  # Attention kernel does not broadcast the mask's query dimension
        if self.fused_attn and not return_attention:
            p = self.attn_drop.p if self.training else 0.0
            out, attn = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p), None
        else:
            scores = (q * self.scale) @ k.transpose(-2, -1)  # (B, H, N, N)
            attn = (scores if bias is None else scores + bias).softmax(dim=-1)
            out = self.attn_drop(attn) @ v  # (B, H, N, d)
        stat = None
        if need == "keys":
            stat = k.mean(dim=1)  # (B, N, d)
        elif need == "cls" and attn is not None:
            stat = attn[:, :, :1]
        elif need == "cls":
            row = (q[:, :, :1] * self.scale) @ k.transpose(-2, -1)  # (B, H, 1, N)
            stat = (row if bias is None else row + bias).softmax(dim=-1)
        out = self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, N, D)))
        return out, attn, stat

    def _first_queries(
        self, x: torch.Tensor, q: int, mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> torch.Tensor:
        """Attention output for the first `q` tokens: Q from those tokens, K and V from all. Same numbers as the
        full computation's first rows, at about (2N + 2q) / 4N of its projection cost. `mask` has q rows
        (`sdpa_mask`); SDPA's causal mask for q < N queries is aligned top-left, i.e. row i sees keys <= i."""
        B, N, D = x.shape
        H, d = self.num_heads, self.head_dim
        w, b = self.qkv.weight, self.qkv.bias
        query = F.linear(x[:, :q], w[:D], None if b is None else b[:D])  # (B, q, D)
        kv = F.linear(x, w[D:], None if b is None else b[D:])  # (B, N, 2D)
        query = query.reshape(B, q, H, d).transpose(1, 2)  # (B, H, q, d)
        k, v = kv.reshape(B, N, 2, H, d).permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, N, d) each
        p = self.attn_drop.p if self.training else 0.0
        out = F.scaled_dot_product_attention(query, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, q, D)))  # (B, q, D)


# --- decoder attention: cached causal self-attention and cross-attention (vit/models/decoder.py) --------------


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
    return_attention: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q k^T / sqrt(d) + mask) v for q (B, H, Nq, d) and k, v (B, H, Nk, d): the fused SDPA call, or the
    explicit path when the probabilities (B, H, Nq, Nk) are asked for. `mask` is already in `expand_mask`'s
    broadcast form; `is_causal` is SDPA's (top-left aligned). Returns (out (B, H, Nq, d), probabilities or None)."""
    if not return_attention:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal), None
    scores = masked_scores((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1), mask, is_causal)  # (B, H, Nq, Nk)
    attn = scores.softmax(dim=-1)
    out = F.dropout(attn, dropout_p) @ v if dropout_p > 0 else attn @ v
    return out, attn


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, N, H*d) -> (B, H, N, d)."""
    B, N, D = x.shape
    return x.reshape(B, N, num_heads, D // num_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, N, d) -> (B, N, H*d): heads side by side again."""
    B, H, N, d = x.shape
    return x.transpose(1, 2).reshape(B, N, H * d)


class CachedSelfAttention(Attention):
    """`Attention` (the same `qkv`/`proj` weights and names) run incrementally for a decoder: the new tokens
    x (B, t, D) attend to the `past` keys and values of the T tokens before them and to themselves, causally.
    Training and full forwards use `Attention.forward(x, is_causal=True)` unchanged; this path is for decoding:

        step(x, past) -> out (B, t, D), (K, V) (B, H, T + t, d) to keep for the next step, probabilities or None

    A chunk of t > 1 new tokens after T > 0 cached ones needs a causal mask aligned bottom-right (new token i sees
    keys <= T + i), which SDPA's `is_causal` (top-left) is not, so it is built explicitly then."""

    def step(
        self,
        x: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
        return_attention: bool = False,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]:
        B, t, D = x.shape
        q, k, v = self.qkv(x).reshape(B, t, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        T = 0 if past is None else past[0].shape[2]
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)  # (B, H, T + t, d)
        mask, is_causal = None, False
        if t > 1 and T == 0:
            is_causal = True
        elif t > 1:
            mask = torch.ones(t, T + t, dtype=torch.bool, device=x.device).tril(diagonal=T)  # (t, T + t)
        p = self.attn_drop.p if self.training else 0.0
        out, attn = attend(q, k, v, mask, is_causal, p, return_attention or not self.fused_attn)
        return self.proj_drop(self.proj(merge_heads(out))), (k, v), attn if return_attention else None


class CrossAttention(nn.Module):
    """Encoder-decoder attention (Vaswani et al., 2017, section 3.2.3): queries from the decoder's tokens
    x (B, Nq, D), keys and values from an encoder's memory (B, M, D), whose padding is masked out with
    `memory_mask` (B, M) (1 / True = a real token, as a tokenizer's attention_mask). Projections: `q` (D -> D),
    `kv` (D -> 2D, one matmul for both) and `proj`. The memory's keys and values depend on the source only, so a
    decoder computes them once per source (`memory_kv`) and passes them to every step (`kv=`).
    The same math as `Attention`: one `attend` call, the fused SDPA path unless probabilities are asked for."""

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        fused_attn: bool = True,
    ) -> None:
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(
                f"embed_dim {dim} is not divisible by num_heads {num_heads}; choose a head count that divides it."
            )
        self.num_heads = num_heads
        self.fused_attn = fused_attn
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def memory_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """memory (B, M, D) -> keys, values (B, H, M, d) each."""
        B, M, D = memory.shape
        k, v = self.kv(memory).reshape(B, M, 2, self.num_heads, D // self.num_heads).permute(2, 0, 3, 1, 4).unbind(0)
        return k, v

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        kv: tuple[torch.Tensor, torch.Tensor] | None = None,
        return_attention: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, Nq, D); memory (B, M, D) or its precomputed `kv`; memory_mask (B, M). Returns (out (B, Nq, D),
        probabilities (B, H, Nq, M) or None)."""
        k, v = self.memory_kv(memory) if kv is None else kv
        # (B, M) -> (B, 1, 1, M) through expand_mask's per-sample form (B, 1, M): a key-padding mask, never read
        # as an (Nq, M) one even when B happens to equal Nq
        mask = None if memory_mask is None else expand_mask(memory_mask[:, None, :], k.shape[2])
        p = self.attn_drop.p if self.training else 0.0
        out, attn = attend(split_heads(self.q(x), self.num_heads), k, v, mask, False, p,
                           return_attention or not self.fused_attn)
        return self.proj_drop(self.proj(merge_heads(out))), attn if return_attention else None
