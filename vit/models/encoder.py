"""The shared Transformer encoder: `Block` and `Encoder`, used unchanged by images and text.

A block is two residual sub-layers, attention then feed-forward (Vaswani et al., 2017, section 3.1):
    pre-norm  (ViT, GPT-2, default):   x = x + DropPath(LS(Attn(Norm(x))));  x = x + DropPath(LS(FFN(Norm(x))))
    post-norm (original Transformer, BERT): x = Norm(x + Attn(x));           x = Norm(x + FFN(x))
    residual post-norm (Swin-V2; timm's ResPostBlock): x = x + DropPath(Norm(Attn(x)));  x = x + DropPath(Norm(FFN(x)))
Pre-norm keeps an identity path from input to output, which is why deep pre-norm stacks train without warmup
tricks; a pre-norm stack needs one final norm after the last block (the model owns it, named `norm`).
Disabled options become `nn.Identity()`, so `forward` has no branches on them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
import torch.fx
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..config import AttentionOptions, SparseOptions
from ..layers import (
    Attention,
    BlockParts,
    DiffAttention,
    DropPath,
    LayerScale,
    Rope,
    TokenState,
    attention_options,
    check_combination,
    get_mlp_layer,
    get_norm_layer,
)
from ..layers.sparse_attention import retune
from .parallel_block import ParallelScalingBlock

__all__ = ["LAYER_NAMES", "PER_BLOCK", "Block", "Encoder", "block_stack", "drop_path_rates", "named_layer",
           "per_block"]


def drop_path_rates(depth: int, rate: float) -> list[float]:
    """Stochastic depth per block, rising linearly from 0 to `rate` (timm's schedule; one block gets `rate`)."""
    return torch.linspace(0, rate, depth, device="cpu").tolist() if depth > 1 else [rate] * depth  # any device context


PER_BLOCK = ("block_layer", "attention", "attn_layer")  # what may differ by depth: one value or one per block


def per_block(depth: int, name: str, value: Any) -> list[Any]:
    """One value for each of `depth` blocks: a list or tuple is one per block (as timm's Eva takes its
    per-block settings), anything else the same for all."""
    if not isinstance(value, (list, tuple)):
        return [value] * depth
    if len(value) != depth:
        raise ValueError(f"{name} has {len(value)} values for {depth} blocks; give one value, or one per block.")
    return list(value)


def block_stack(block_layer: Callable[..., nn.Module] | Sequence[Callable[..., nn.Module]], depth: int, dim: int,
                num_heads: int, mlp_ratio: float, qkv_bias: bool, drop_rate: float, attn_drop_rate: float,
                drop_path_rate: float, **block_kwargs) -> list[nn.Module]:
    """`depth` blocks of `block_layer` (`Block`, the decoder's `DecoderBlock`, `partial(Block, attn_layer=...)`),
    stochastic depth rising to `drop_path_rate`: the layers of `Encoder` and `Decoder`. `block_layer` and the
    keywords in PER_BLOCK may be a sequence with one value per block."""
    own = {k: per_block(depth, k, block_kwargs.pop(k)) for k in PER_BLOCK[1:] if k in block_kwargs}
    if "attn_layer" in own:
        own["attn_layer"] = [named_layer("attn_layer", v, i) for i, v in enumerate(own["attn_layer"])]
    layers = [named_layer("block_layer", v, i) for i, v in enumerate(per_block(depth, "block_layer", block_layer))]
    return [layers[i](dim, num_heads, mlp_ratio, qkv_bias, drop_rate, attn_drop_rate, rate, **block_kwargs,
                      **{k: v[i] for k, v in own.items()})
            for i, rate in enumerate(drop_path_rates(depth, drop_path_rate))]


def named_layer(kind: str, value: Any, index: int) -> Any:
    """A layer given by timm's name (`attn_layer='diff'`, `block_layer='parallel'`; see LAYER_NAMES) -> its class
    for block `index` (differential attention's lambda_init depends on it); a class or factory passes as it is."""
    if not isinstance(value, str):
        return value
    names = LAYER_NAMES[kind]
    if value not in names:
        raise ValueError(f"unknown {kind} {value!r}; choose one of {', '.join(map(repr, names))} or pass a class.")
    return names[value](index)


# timm's names for the attention and block classes (its ATTN_LAYERS and block_fn), each a factory of the class
# for block `index`
LAYER_NAMES: dict[str, dict[str, Callable[[int], Any]]] = {
    "attn_layer": {"attn": lambda i: Attention, "diff": lambda i: partial(DiffAttention, layer_index=i)},
    "block_layer": {"block": lambda i: Block, "parallel": lambda i: ParallelScalingBlock,
                    "diff_parallel": lambda i: partial(ParallelScalingBlock, diff=True, layer_index=i)},
}


def _gamma_names_out(module, state, prefix, local_metadata):
    """state_dict hook: `ls1.gamma` / `ls2.gamma` saved as Eva's `gamma_1` / `gamma_2`."""
    for i in (1, 2):
        if f"{prefix}ls{i}.gamma" in state:
            state[f"{prefix}gamma_{i}"] = state.pop(f"{prefix}ls{i}.gamma")
    return state


def _gamma_names_in(state, prefix, *args):
    """load_state_dict pre-hook: Eva's `gamma_1` / `gamma_2` read into `ls1.gamma` / `ls2.gamma`."""
    for i in (1, 2):
        if f"{prefix}gamma_{i}" in state:
            state[f"{prefix}ls{i}.gamma"] = state.pop(f"{prefix}gamma_{i}")


class Block(nn.Module):
    """One Transformer layer: tokens (B, N, D) -> (B, N, D). Two residual sub-layers, attention then the FFN,
    each with its norm before (`norm_first=True`, ViT) or after the residual sum (post-norm, BERT), an optional
    LayerScale (`init_values`) and stochastic depth (`drop_path`); `parts` (vit.layers.BlockParts: Eva's separate
    q / k / v names, NormFormer's inner norms, projections without bias) goes to both sub-layers;
    `sparse_attention` (a `SparseOptions`, None for dense) goes to `Attention` whole. `norm_layer` ('layernorm' |
    'rmsnorm' or a constructor), `mlp_layer` ('gelu' | 'swiglu' or a class) and `attn_layer` (`Attention` or a
    subclass, e.g. the decoder's cached one) pick the parts; parameter names follow timm (`norm1`, `attn`, `ls1`,
    `norm2`, `mlp`, `ls2`), so timm's weights load. `attention` (a vit.config.AttentionOptions) goes to
    the attention whole; without it, `qkv_bias`, `fused_attn` and `sparse_attention` make one. A sub-layer is
    `attn_input` -> the layer -> `attn_residual`,
    then `ffn`: a block that adds a sub-layer (the decoder's cross-attention) reuses them. `rel_pos` (a factory,
    vit.layers.rel_pos) gives the attention a relative position bias."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        init_values: float | None = None,
        norm_layer: str | Callable[[int], nn.Module] = "layernorm",
        mlp_layer: str | type[nn.Module] = "gelu",
        norm_first: bool = True,
        fused_attn: bool = True,
        sparse_attention: SparseOptions | None = None,
        attn_layer: type[Attention] = Attention,
        rope: Rope | None = None,
        layer_scale_names: str = "ls",
        parts: BlockParts | None = None,
        rel_pos: Callable[[], nn.Module] | None = None,
        attention: AttentionOptions | None = None,
    ) -> None:
        super().__init__()
        attention = attention_options(attention, qkv_bias, fused_attn, sparse_attention)
        norm = get_norm_layer(norm_layer) if isinstance(norm_layer, str) else norm_layer
        mlp = get_mlp_layer(mlp_layer) if isinstance(mlp_layer, str) else mlp_layer
        self.norm_first = norm_first
        # res-post-norm (Swin v2; timm's ResPostBlock, Eva's use_post_norm): x + Norm(f(x)), no norm on the input
        self.res_post = parts is not None and parts.res_post_norm
        check_combination(res_post_norm=self.res_post, post_norm=not norm_first)
        position = {k: v for k, v in (("rope", rope), ("rel_pos", rel_pos)) if v is not None}
        self.norm1 = norm(dim)
        # optional parts (vit.layers.block_parts) only when asked, so attention / MLP classes without them still fit
        attn_parts = {} if parts is None else {"parts": parts}
        if parts is not None or attention.qk_norm:  # the block's norm for the inner and q / k norms
            attn_parts["norm_layer"] = norm
        mlp_parts = {} if parts is None else {"bias": parts.proj_bias,
                                              "norm_layer": norm if parts.scale_mlp_norm else None}
        self.attn = attn_layer(dim, num_heads, attn_drop=attn_drop, proj_drop=drop, options=attention,
                               **position, **attn_parts)
        layer_scale = init_values and not self.res_post  # res-post-norm: init_values starts the norms' weights
        self.ls1 = LayerScale(dim, init_values) if layer_scale else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm(dim)
        self.mlp = mlp(dim, int(dim * mlp_ratio), drop=drop, **mlp_parts)
        mlp_scale = layer_scale and not (parts is not None and parts.attn_only_layer_scale)
        self.ls2 = LayerScale(dim, init_values) if mlp_scale else nn.Identity()
        if self.res_post and init_values:  # timm's ResPostBlock: each branch starts near zero through its norm
            for n in (self.norm1, self.norm2):
                nn.init.constant_(n.weight, init_values)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        if layer_scale_names not in ("ls", "gamma"):
            raise ValueError(f"layer_scale_names must be 'ls' (timm's ViT) or 'gamma' (Eva, BEiT), got "
                             f"{layer_scale_names!r}.")
        if layer_scale_names == "gamma" and init_values:  # Eva's checkpoints: gamma_1 / gamma_2, same tensors
            self._register_state_dict_hook(_gamma_names_out)
            self._register_load_state_dict_pre_hook(_gamma_names_in)
        # token reduction between attention and MLP (vit.layers.token_reduction), set by the model's
        # `set_token_reduction`; None keeps this block exactly the plain one
        self.token_reduction: nn.Module | None = None

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        return_attention: bool = False,
        num_queries: int | None = None,
        rope: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, N, D) -> (B, N, D), plus this layer's attention probabilities (B, H, N, N) when asked.
        With `num_queries=q` (pre-norm) only the first q tokens are computed: (B, q, D). `rope`: a rotary table
        for the patch tokens (vit.layers.rope), passed to the attention."""
        if num_queries is not None:
            y, _ = self.attn(self.attn_input(x), mask, is_causal, num_queries=num_queries, rope=rope)
            return self.ffn(self.attn_residual(x[:, :num_queries], y)), None
        y, attn = self.attn(self.attn_input(x), mask, is_causal, return_attention, rope=rope)
        return self.ffn(self.attn_residual(x, y)), attn

    def attn_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the attention sub-layer reads: Norm(x) pre-norm, x post-norm and res-post-norm."""
        return self.norm1(x) if self.norm_first and not self.res_post else x

    def attn_residual(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The attention sub-layer's residual sum with its output y: x + DropPath(LS(y)), normalised after the
        sum post-norm; x + DropPath(LS(Norm(y))) res-post-norm."""
        if self.res_post:
            return x + self.drop_path1(self.ls1(self.norm1(y)))
        x = x + self.drop_path1(self.ls1(y))
        return x if self.norm_first else self.norm1(x)

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        """The feed-forward sub-layer with its residual: (B, N, D) -> (B, N, D)."""
        if self.res_post:
            return x + self.drop_path2(self.ls2(self.norm2(self.mlp(x))))
        if self.norm_first:
            return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return self.norm2(x + self.drop_path2(self.ls2(self.mlp(x))))

    @torch.jit.unused
    def _forward_reduced(
        self, x: torch.Tensor, tokens: TokenState, return_attention: bool, num_queries: int | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The same block with token reduction between attention and MLP: (B, N, D) -> (B, N', D). Attention
        maps come back on the input tokens (B, H, N0, N0) through `tokens`' source tracking."""
        bias = tokens.attn_bias()  # (B, 1, 1, N) log token sizes once tokens were merged, else None
        if num_queries is not None:  # [CLS]-only last block: no reduction needed after it
            return self.forward(x, bias, num_queries=num_queries)
        reduce = self.token_reduction
        y, attn, stat = self.attn.forward_reduce(self.attn_input(x), bias, getattr(reduce, "needs", None),
                                                 return_attention)
        x = self.attn_residual(x, y)
        if tokens.source is not None:
            tokens.history.append(tokens.source)
            attn = tokens.to_full_grid(attn) if attn is not None else None
        if reduce is not None:
            x = reduce(x, stat, tokens)
        return self.ffn(x), attn


class Encoder(nn.ModuleList):
    """A stack of `Block`s: tokens (B, N, D) -> (B, N, D), plus one (B, H, N, N) attention map per block when
    asked; the image and text models both use it unchanged. `block_layer` (a Block class or factory, e.g.
    `partial(Block, attn_layer=MyAttention)` as dinov2's block_fn), `attention` (AttentionOptions) and `attn_layer`
    each take one value for every block or a sequence with one per block (PER_BLOCK).
    Being a ModuleList, its blocks are named `0`, `1`, ... so a model that stores it
    as `blocks` has timm's keys (`blocks.0.attn.qkv.weight`). Stochastic depth rises linearly with depth.
    With `grad_checkpointing`, training recomputes each block's activations in the backward pass instead of
    storing them (less memory, about one more forward of compute)."""

    __jit_unused_properties__ = ["fused_attn"]  # a Python-side switch; TorchScript need not compile it

    def __init__(
        self,
        depth: int,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        block_layer: Callable[..., nn.Module] | Sequence[Callable[..., nn.Module]] = Block,
        **block_kwargs,
    ) -> None:
        super().__init__(block_stack(block_layer, depth, dim, num_heads, mlp_ratio, qkv_bias, drop_rate,
                                     attn_drop_rate, drop_path_rate, **block_kwargs))
        self.grad_checkpointing = False
        self.reduces_tokens = False  # set by set_token_reduction

    @property
    def fused_attn(self) -> bool:
        return all(blk.attn.fused_attn for blk in self)

    @fused_attn.setter
    def fused_attn(self, value: bool) -> None:
        for blk in self:
            blk.attn.fused_attn = value

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        return_attention: bool = False,
        last_queries: int | None = None,
        rope: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """x: (B, N, D). Returns the last block's output and, when asked, one (B, H, N, N) map per block.
        `last_queries=q` computes the last block for the first q tokens only (see `Block`): (B, q, D).
        `rope`: one rotary table (vit.layers.rope) shared by every block."""
        attentions: list[torch.Tensor] = []
        if self.reduces_tokens and not torch.jit.is_scripting():  # TorchScript keeps the plain stack only
            # the reduced tokens have no grid places for the table to rotate
            check_combination(token_reduction=True, rope_table=rope is not None)
            return self._forward_reduced(x, mask, is_causal, return_attention, last_queries)
        last = -1
        for i, _ in enumerate(self):  # len(self): TorchScript has no len() of a ModuleList in its own methods
            last = i
        for i, blk in enumerate(self):
            queries = last_queries if i == last else None
            table = rope
            if rope is not None and rope.dim() == 5:  # RoPE-Mixed: (depth, 1, H, N, 2d), one table per block
                table = rope[i]
            if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
                x, attn = checkpoint(blk, x, mask, is_causal, return_attention, queries, table, use_reentrant=False)
            else:
                x, attn = blk(x, mask, is_causal, return_attention, queries, table)
            if return_attention and attn is not None:
                attentions.append(attn)
        return x, attentions

    def features(self) -> dict[str, bool]:
        """Its blocks' own kinds as vit.layers.combinations names them (`diff_attention`, `parallel_block`), for
        the switches that must refuse them."""
        kinds = {getattr(m, "feature", None) for blk in self for m in (blk, blk.attn)}
        return {k: True for k in kinds if k}

    def set_sparse_attention(self, method: str | None, **options) -> None:
        """Every block's sparse attention switched or retuned, weights kept (vit.layers.sparse_attention.retune):
        `method` None (dense), "moba" or "dsa"; `options` SparseOptions fields (None: unchanged)."""
        check_combination(sparse_attention=method is not None, **self.features())
        for blk in self:
            a = blk.attn
            a.sparse = retune(a.sparse, method, a.qkv.in_features, a.num_heads, **options)

    def set_token_reduction(self, modules: list[nn.Module | None]) -> None:
        """One reduction module (or None) per block (vit.layers.token_reduction); all None: the plain stack."""
        for blk, m in zip(self, modules):
            blk.token_reduction = m
        self.reduces_tokens = any(m is not None for m in modules)

    def _forward_reduced(
        self, x: torch.Tensor, mask: torch.Tensor | None, is_causal: bool, return_attention: bool,
        last_queries: int | None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """`forward` while some block reduces tokens: a TokenState (token sizes; with `return_attention` also
        which patches each token stands for, kept as `last_tokens` for drawing) runs through every block. No
        gradient checkpointing here: the state is updated in place, and a recomputed block would update it twice."""
        check_combination(token_reduction=True, tracing=isinstance(x, torch.fx.Proxy),
                          attn_mask=mask is not None or is_causal)
        tokens = TokenState.start(x, track_source=return_attention)
        self.last_tokens = tokens if return_attention else None
        attentions: list[torch.Tensor] = []
        last = len(self) - 1
        for i, blk in enumerate(self):
            x, attn = blk._forward_reduced(x, tokens, return_attention, last_queries if i == last else None)
            if return_attention and attn is not None:
                attentions.append(attn)
        return x, attentions
