"""Multi-head self-attention (Vaswani et al., 2017, "Attention Is All You Need", eq. 1 and section 3.2.2).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Q, K and V come from one fused Linear (`qkv`, D -> 3D) so the three projections are a single matmul, named as
in timm so that timm weights load unchanged. The formula itself is `vit.layers.sdpa.attend`, shared by every layer
here and by the sparse kernels: the fused path calls `F.scaled_dot_product_attention`, which dispatches to
FlashAttention kernels (on CPU `_scaled_dot_product_flash_attention_for_cpu`) and never materializes the (N, N)
score matrix; the explicit path computes softmax(QK^T/sqrt(d))V step by step and is used only when a caller asks
for the attention probabilities, for inspection and attention rollout.
With `sparse_attention=SparseOptions("dsa" | "moba", ...)` each query attends only to the top-k key blocks a
scorer picks (vit.layers.sparse_attention, which holds the scorers and kernels; this module only dispatches to it).
With `rope=Rope(...)` the caller passes a rotary table (vit.layers.rope) to `forward`, and the patch tokens' q and
k are rotated before `attend` (fused or explicit alike); prefix tokens are not rotated. With `rel_pos` (vit.layers.
rel_pos) a relative position bias is added to the scores as a float mask, before `attend`'s one SDPA call.
`qkv_bias="qv"` is BEiT's / EVA's layout: biases for q and v only, the k bias fixed at zero (a k bias shifts every
score of a query equally, which softmax ignores), saved as `q_bias` / `v_bias`.

For a decoder (section 3.2.3): `CachedSelfAttention` is `Attention` run step by step over cached keys and values,
and `CrossAttention` takes its queries from the decoder and its keys and values from an encoder's memory.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from ..config import AttentionOptions, SparseOptions
from .block_parts import BlockParts, join_qkv, split_qkv_names
from .combinations import check_combination
from .rel_pos import RelPosTable, SharedRelPos, table_names_in, table_names_out
from .rope import Rope, apply_rope
from .sdpa import add_bias, attend, expand_mask, merge_heads, sdpa_mask, split_heads, split_qkv
from .sparse_attention import SparseAttention

__all__ = ["Attention", "CachedSelfAttention", "CrossAttention", "attention_options"]

torch.fx.wrap("sdpa_mask")  # a leaf in traced graphs (see sdpa_mask); wrapped where it is called
torch.fx.wrap("add_bias")  # likewise: its branches on the mask's form stay out of traced graphs


def attention_options(options: AttentionOptions | None, qkv_bias: bool | str = True, fused_attn: bool = True,
                      sparse_attention: SparseOptions | None = None) -> AttentionOptions:
    """The one object of a layer's or block's attention settings: `options` as given, or made from the flat
    keywords (timm's Attention takes them; the text encoder and decoder pass them), never both."""
    if options is None:
        return AttentionOptions(qkv_bias, fused_attn=fused_attn, sparse_attention=sparse_attention)
    if (qkv_bias, fused_attn, sparse_attention) != (True, True, None):
        raise ValueError("pass the attention settings either as one AttentionOptions or as qkv_bias / fused_attn / "
                         "sparse_attention keywords, not both.")
    return options


def _check_heads(dim: int, num_heads: int) -> None:
    if dim % num_heads != 0:
        raise ValueError(
            f"embed_dim {dim} is not divisible by num_heads {num_heads}; choose a head count that divides it."
        )


def _kv_heads(num_heads: int, num_kv_heads: int | None) -> int:
    if num_kv_heads is not None and num_heads % num_kv_heads:
        raise ValueError(f"num_kv_heads {num_kv_heads} does not divide num_heads {num_heads}; each key / value head "
                         "serves a whole group of query heads, so pick a divisor.")
    return num_heads if num_kv_heads is None else num_kv_heads


class Attention(nn.Module):
    """Multi-head self-attention with a fused QKV projection: tokens (B, N, D) -> (B, N, D), plus the attention
    probabilities (B, H, N, N) when asked (the explicit path). Each of the H heads attends with width D / H;
    masks take any form `expand_mask` accepts, and `num_queries=q` computes the first q queries only (B, q, D).

    Args:
        dim: token width D.
        num_heads: number of heads H; D must be divisible by H (head width D / H).
        qkv_bias: add a bias to the QKV projection (ViT and BERT do); "qv": learned q and v biases with the k bias
            fixed at zero (Eva, BEiT, DINOv3 `_qkvb`: `q_bias`, `v_bias`; `qkv` itself has none).
        attn_drop: dropout on the attention probabilities.
        proj_drop: dropout after the output projection.
        fused_attn: use `F.scaled_dot_product_attention` (default); False selects the explicit path always.
        sparse_attention: None (dense) or a `SparseOptions`: top-k key blocks per query, run by the sparse core
            `self.sparse` (a `vit.layers.sparse_attention.SparseAttention`).
        rope: None, or a `Rope`: `forward(..., rope=table)` rotates q and k of the last M tokens by the table
            (M, 2d) of `vit.layers.rope.rope_table` / `RotaryEmbedding` (this layer keeps only its pair layout).
        parts: a `BlockParts` (vit.layers.block_parts): q / k / v saved as three Linears, a norm (`norm_layer`)
            on the heads' output before `proj`, `proj` without bias.
        rel_pos: None, or a factory (vit.layers.rel_pos.rel_pos_layers) of this layer's bias module, saved as
            `rel_pos` (timm's relpos), or of a reference to the model's shared one.
        options: the settings as one `vit.config.AttentionOptions` (qkv_bias, qk_norm, fused_attn,
            sparse_attention), as `Block` passes them; or None, made from the three keywords above.

    The contract an attention class keeps, so that `Block(attn_layer=...)`, the Encoder (one class or one per
    block), `create_model(attn_layer=...)` and the model's forward paths take it unchanged:
      - `__init__(dim, num_heads, *, attn_drop, proj_drop, options)` and, when the model has them, `rope=` (a
        `Rope`), `rel_pos=` (a factory), `parts=` (a BlockParts) and `norm_layer=`; subclass this class to inherit
        them all.
      - `forward(x, mask=None, is_causal=False, return_attention=False, num_queries=None, rope=None)` ->
        `(out (B, N, D), probabilities (B, H, N, N) or None)`: `mask` in any form `expand_mask` takes (True / 1 =
        attend, or a float bias), `rope` a table for the last M tokens, `num_queries=q` the first q rows only
        (B, q, D); with `return_attention` (or `fused_attn` False) the explicit path returns the probabilities
        the output was computed from, so rollout and `forward_with_attention` see what the model did.
      - attributes `fused_attn` (the Encoder switches it), `num_heads`, `qkv` (the sparse switch reads its width)
        and `sparse` (None when dense); `forward_reduce` for token reduction.
    The simplest subclass changes one step: `_qk` (each head's q and k before the scores) or `_project` (heads ->
    output), and every path follows (fused, explicit, sparse, first queries), as tests/test_attention_seam.py
    shows with a temperature on the logits.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool | str = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        fused_attn: bool = True,
        sparse_attention: SparseOptions | None = None,
        rope: Rope | None = None,
        parts: BlockParts = BlockParts(),  # noqa: B008 (frozen: one shared default is safe)
        norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
        rel_pos: Callable[[], nn.Module | SharedRelPos] | None = None,
        options: AttentionOptions | None = None,
    ) -> None:
        super().__init__()
        _check_heads(dim, num_heads)
        options = attention_options(options, qkv_bias, fused_attn, sparse_attention)
        check_combination(sparse_attention=options.sparse_attention is not None, rel_pos=rel_pos is not None)
        self.options = options
        qkv_bias, sparse_attention = options.qkv_bias, options.sparse_attention
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused_attn = options.fused_attn
        # grouped-query attention: fewer key / value heads, each repeated for its group of query heads
        self.num_kv_heads = _kv_heads(num_heads, options.num_kv_heads)
        kv = self.num_kv_heads * self.head_dim
        self.qkv_split = [dim, kv, kv]  # the rows of q, k, v in `qkv`
        self.qkv = nn.Linear(dim, dim + 2 * kv, bias=qkv_bias is True)
        # Eva's q / v biases: the k bias stays zero (a buffer: with rotary positions it would not cancel in softmax)
        self.q_bias = nn.Parameter(torch.zeros(dim)) if qkv_bias == "qv" else None
        self.v_bias = nn.Parameter(torch.zeros(kv)) if qkv_bias == "qv" else None
        self.register_buffer("k_bias", torch.zeros(kv) if qkv_bias == "qv" else None, persistent=False)
        # QK-norm (Dehghani et al., 2023, "Scaling Vision Transformers to 22 Billion Parameters"): each head's
        # queries and keys normalised over their d channels, before rotary positions and the scores (timm's names)
        self.q_norm = norm_layer(self.head_dim) if options.qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if options.qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(dim) if parts.scale_attn_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=parts.proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)
        if not parts.qkv_fused:  # saved as q_proj / k_proj / v_proj (timm's Eva), computed as one matmul
            self._register_state_dict_hook(split_qkv_names)
            self._register_load_state_dict_pre_hook(join_qkv)
        self.sparse = None if sparse_attention is None else SparseAttention(sparse_attention, dim, num_heads)
        self.rotate_half = rope is not None and rope.rotate_half  # the table's pair layout (vit.layers.rope)
        self.rel_pos = None if rel_pos is None else rel_pos()  # forward() -> the (1, H, N, N) score bias
        if isinstance(self.rel_pos, RelPosTable):  # BEiT saves its table on the attention itself
            self._register_state_dict_hook(table_names_out)
            self._register_load_state_dict_pre_hook(table_names_in)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        return_attention: bool = False,
        num_queries: int | None = None,
        rope: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, N, D). mask: see `expand_mask`. rope: a rotary table (M, 2d) or (B, M, 2d) for the last M tokens.
        Returns (output (B, N, D), probabilities (B, H, N, N) or None).

        `num_queries=q` computes the output of the first q tokens only (all N tokens still serve as keys and
        values): (B, q, D). A classifier that reads only [CLS] needs nothing else from its last layer.
        Masks are prepared by `sdpa_mask` (an FX leaf), so `mask` and `is_causal` meet no Python branch here
        and the module traces with torch.fx as well as it scripts."""
        N = x.shape[1]
        if not torch.jit.is_scripting():  # a scripted layer is dense (see below): nothing to refuse
            check_combination(sparse_attention=self.sparse is not None, rope_table=rope is not None,
                              rel_pos=self.rel_pos is not None)  # set_sparse_attention may have come after
        if self.rel_pos is not None:  # (1, H, N, N) relative position bias, one float mask with the user's
            mask = add_bias(mask, self.rel_pos(), x)
        if not torch.jit.is_scripting():  # TorchScript compiles the dense layer only
            if self.sparse is not None and num_queries is None and self.sparse.runs(N):
                return self._sparse_forward(x, mask, is_causal, return_attention)
            if self.sparse is not None:
                self.sparse.last_loss = None  # dense this time: no indexer KL (a stale one would be summed again)
        if num_queries is not None:  # a few queries (the [CLS] of a last block) attend densely: O(N) anyway
            mask, is_causal = sdpa_mask(mask, is_causal, N, num_queries)
            return self._first_queries(x, num_queries, mask, is_causal, rope), None
        mask, is_causal = sdpa_mask(mask, is_causal, N, N)
        q, k, v = self._qkv(x)
        if rope is not None:  # (B, H, N, d): positions enter as rotations of q and k, before the fused kernel
            q, k = apply_rope(q, rope, self.rotate_half), apply_rope(k, rope, self.rotate_half)
        out, attn = attend(q, k, v, mask, is_causal, self._dropout_p(), return_attention or not self.fused_attn)
        return self._project(out), attn

    def _qkv(self, x: torch.Tensor) -> list[torch.Tensor]:
        """(B, N, D) -> q, k, v (B, H, N, d) each, q and k normalised per head (QK-norm; identities without)."""
        q, k, v = self._project_qkv(x)
        q, k = self._qk(q, k)
        return [q, self._kv_groups(k), self._kv_groups(v)]

    def _kv_groups(self, t: torch.Tensor) -> torch.Tensor:
        """Grouped-query attention: key / value heads (B, H_kv, N, d) -> (B, H, N, d), head h reading kv head
        h // (H / H_kv) (timm's repeat_interleave), after the q / k norms so those run once per kv head."""
        groups = self.num_heads // self.num_kv_heads
        return t if groups == 1 else t.repeat_interleave(groups, dim=1)

    def _split(self, qkv: torch.Tensor, parts: int = 3) -> list[torch.Tensor]:
        """The projection's output (B, N, rows) -> q, k, v heads (or k, v with parts=2): one view when every part
        has H heads, else q with H and k, v with H_kv heads each."""
        if self.num_kv_heads == self.num_heads:
            return split_qkv(qkv, self.num_heads, parts)
        pieces = torch.split(qkv, self.qkv_split[3 - parts:], dim=-1)
        heads = [self.num_heads, self.num_kv_heads, self.num_kv_heads][3 - parts:]
        return [split_heads(t, h) for t, h in zip(pieces, heads)]

    def _qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each head's queries (B, H, Nq, d) and keys (B, H, N, d) before rotary positions and the scores: QK-norm
        here. Every path calls it (fused, explicit, sparse, the first-queries one), so a subclass that changes the
        logits elementwise (a temperature, a per-head scale) overrides this one step."""
        return self.q_norm(q), self.k_norm(k)

    def _project_qkv(self, x: torch.Tensor) -> list[torch.Tensor]:
        """(B, N, D) -> q, k, v (B, H, N, d) each: one matmul for all three."""
        if self.q_bias is not None and self.k_bias is not None and self.v_bias is not None:
            bias = torch.cat([self.q_bias, self.k_bias, self.v_bias])
            if not torch.jit.is_scripting():
                if self._plain_qkv():  # the bias inside the matmul, as timm: no extra pass over (B, N, 3D)
                    return self._split(F.linear(x, self.qkv.weight, bias))
            return self._split(self.qkv(x) + bias)  # an adapter around qkv (LoRA) takes part
        return self._split(self.qkv(x))

    @torch.jit.unused
    def _plain_qkv(self) -> bool:
        """Whether `qkv` is still a plain Linear (not wrapped by an adapter such as LoRA)."""
        return type(self.qkv) is nn.Linear

    def _qkv_bias(self) -> torch.Tensor | None:
        """The bias (3D,) of q, k, v together: qkv's own, Eva's [q_bias; 0; v_bias], or None."""
        if self.q_bias is not None and self.k_bias is not None and self.v_bias is not None:
            return torch.cat([self.q_bias, self.k_bias, self.v_bias])
        return self.qkv.bias

    def _project(self, out: torch.Tensor) -> torch.Tensor:
        """Heads (B, H, N, d) -> the layer's output (B, N, D): heads side by side, the optional inner norm
        (`parts.scale_attn_norm`), output projection, dropout."""
        return self.proj_drop(self.proj(self.norm(merge_heads(out))))

    def _dropout_p(self) -> float:
        return self.attn_drop.p if self.training else 0.0

    @torch.jit.unused
    def _sparse_forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, is_causal: bool, return_attention: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`forward` through the sparse core: the same projections, attention on the selected key blocks."""
        q, k, v = self._qkv(x)
        out, attn = self.sparse(x, q, k, v, expand_mask(mask, x.shape[1]), is_causal, return_attention,
                                self._dropout_p())
        return self._project(out), attn

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
        N = x.shape[1]
        check_combination(token_reduction=True, rel_pos=self.rel_pos is not None)
        q, k, v = self._qkv(x)
        bias = None if bias is None else bias.to(q.dtype)
        if bias is not None and torch.compiler.is_exporting():  # (B, 1, 1, N) -> (B, 1, N, N): ONNX Runtime's
            bias = bias.expand(-1, -1, N, -1)  # Attention kernel does not broadcast the mask's query dimension
        out, attn = attend(q, k, v, bias, False, self._dropout_p(), return_attention or not self.fused_attn)
        stat = None
        if need == "keys":
            stat = k.mean(dim=1)  # (B, N, d)
        elif need == "cls" and attn is not None:
            stat = attn[:, :, :1]
        elif need == "cls":
            stat = attend(q[:, :, :1], k, v, bias, explicit=True)[1]  # (B, H, 1, N)
        return self._project(out), attn, stat

    def _first_queries(
        self, x: torch.Tensor, q: int, mask: torch.Tensor | None = None, is_causal: bool = False,
        rope: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention output for the first `q` tokens: Q from those tokens, K and V from all. Same numbers as the
        full computation's first rows, at about (2N + 2q) / 4N of its projection cost. `mask` has q rows
        (`sdpa_mask`); SDPA's causal mask for q < N queries is aligned top-left, i.e. row i sees keys <= i."""
        D = x.shape[2]
        w, b = self.qkv.weight, self._qkv_bias()
        query = F.linear(x[:, :q], w[:D], None if b is None else b[:D])  # (B, q, D)
        k, v = self._split(F.linear(x, w[D:], None if b is None else b[D:]), 2)  # (B, H_kv, N, d) each
        query, k = self._qk(split_heads(query, self.num_heads), k)
        k, v = self._kv_groups(k), self._kv_groups(v)
        if rope is not None:  # keys rotated; the q queries are prefix tokens, which rotary positions leave alone
            if q > x.shape[1] - rope.shape[-2]:
                raise ValueError(f"num_queries={q} reaches into the rotated patch tokens; use at most the prefix.")
            k = apply_rope(k, rope, self.rotate_half)
        out, _ = attend(query, k, v, mask, is_causal, self._dropout_p())
        return self._project(out)  # (B, q, D)


# --- decoder attention: cached causal self-attention and cross-attention (vit/models/decoder.py) --------------


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
        t = x.shape[1]
        q, k, v = self._qkv(x)
        T = 0 if past is None else past[0].shape[2]
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)  # (B, H, T + t, d)
        mask, is_causal = None, False
        if t > 1 and T == 0:
            is_causal = True
        elif t > 1:
            mask = torch.ones(t, T + t, dtype=torch.bool, device=x.device).tril(diagonal=T)  # (t, T + t)
        out, attn = attend(q, k, v, mask, is_causal, self._dropout_p(), return_attention or not self.fused_attn)
        return self._project(out), (k, v), attn if return_attention else None


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
        _check_heads(dim, num_heads)
        self.num_heads = num_heads
        self.fused_attn = fused_attn
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def memory_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """memory (B, M, D) -> keys, values (B, H, M, d) each."""
        k, v = split_qkv(self.kv(memory), self.num_heads, 2)
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
