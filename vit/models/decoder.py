"""The Transformer decoder (Vaswani et al., 2017, section 3.1), built from the encoder's own parts.

A decoder block is the encoder's `Block` (a subclass, its sub-layers reused) with one more residual sub-layer
between attention and the FFN:
    pre-norm:   x = x + SelfAttn(Norm(x), causal);  x = x + CrossAttn(Norm(x), memory);  x = x + FFN(Norm(x))
    post-norm:  x = Norm(x + SelfAttn(x, causal));  x = Norm(x + CrossAttn(x, memory));  x = Norm(x + FFN(x))
Masked (causal) self-attention lets position i see positions <= i only, so training predicts every next token
of a target at once; cross-attention takes its queries from the decoder and its keys and values from the
encoder's output (the "memory"), with the memory's padding masked out. The shared names (`norm1`, `attn`,
`norm2`, `mlp`) are `Block`'s, so a decoder block holds an encoder block's weights plus `cross_norm` and
`cross_attn`.

Generation runs the decoder one token at a time with a `DecoderCache`: each self-attention appends the new
token's key and value to those of the tokens before it, and each cross-attention computes the memory's keys
and values once per source; a step then costs O(T) instead of re-running the whole prefix (O(T^2)).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from ..layers import CachedSelfAttention, CrossAttention, add_pos_embed_1d, get_norm_layer
from .encoder import Block, block_stack
from .text_encoder import check_text_sizes

__all__ = ["DecoderBlock", "Decoder", "DecoderCache", "LayerCache", "TextDecoder"]

KV = tuple[torch.Tensor, torch.Tensor]  # keys, values (B, H, N, d)


@dataclass
class LayerCache:
    """One decoder block's cached keys and values: its self-attention's (growing by one token per step) and its
    cross-attention's over the memory (fixed for a source)."""

    self_kv: KV | None = None
    cross_kv: KV | None = None


@dataclass
class DecoderCache:
    """Everything a decoding step reuses: per-block `LayerCache`s, the memory's padding mask (B, M) and how many
    target tokens are cached (the position of the next one)."""

    layers: list[LayerCache] = field(default_factory=list)
    memory_mask: torch.Tensor | None = None
    length: int = 0

    def repeat_interleave(self, k: int) -> None:
        """Each source's row repeated `k` times (rows b*k .. b*k + k-1), for k beams per source: the memory's keys
        and values are copied, not computed again."""
        def repeat(kv: KV | None) -> KV | None:
            return None if kv is None else (kv[0].repeat_interleave(k, 0), kv[1].repeat_interleave(k, 0))

        for layer in self.layers:
            layer.self_kv, layer.cross_kv = repeat(layer.self_kv), repeat(layer.cross_kv)
        if self.memory_mask is not None:
            self.memory_mask = self.memory_mask.repeat_interleave(k, 0)

    def reorder(self, index: torch.Tensor) -> None:
        """Keep rows `index` (B',) of the self-attention keys and values: beam search's new beams continue the
        prefixes of the beams they came from. Cross-attention keys and values are left alone: `index` only picks
        among the beams of one source (rows b*K .. b*K + K-1), whose memories are the same."""
        for layer in self.layers:
            if layer.self_kv is not None:
                layer.self_kv = (layer.self_kv[0].index_select(0, index), layer.self_kv[1].index_select(0, index))


class DecoderBlock(Block):
    """One decoder layer: target tokens (B, T, D) and memory (B, M, D) -> (B, T, D). The encoder's `Block` (its
    causal self-attention sub-layer, cached for decoding, and its FFN sub-layer, with their norms before
    (`norm_first`) or after the sum, and stochastic depth) with cross-attention to the memory added between them
    (`cross_norm`, `cross_attn`); `norm_layer` and `mlp_layer` as in `Block`."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        norm_layer: str | Callable[[int], nn.Module] = "layernorm",
        mlp_layer: str | type[nn.Module] = "gelu",
        norm_first: bool = True,
        fused_attn: bool = True,
    ) -> None:
        super().__init__(dim, num_heads, mlp_ratio, qkv_bias, drop, attn_drop, drop_path, norm_layer=norm_layer,
                         mlp_layer=mlp_layer, norm_first=norm_first, fused_attn=fused_attn,
                         attn_layer=CachedSelfAttention)
        norm = get_norm_layer(norm_layer) if isinstance(norm_layer, str) else norm_layer
        self.cross_norm = norm(dim)
        self.cross_attn = CrossAttention(dim, num_heads, qkv_bias, attn_drop, drop, fused_attn)

    def _self_attn(
        self, x: torch.Tensor, cache: LayerCache | None, return_attention: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if cache is None:  # the whole target at once: Attention.forward with SDPA's causal mask
            return self.attn(x, None, True, return_attention)
        y, cache.self_kv, attn = self.attn.step(x, cache.self_kv, return_attention)
        return y, attn

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None,
        memory_mask: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        return_attention: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """x (B, T, D) target tokens (with a `cache`: the new ones after those cached); memory (B, M, D), or None
        when the cache holds its keys and values; memory_mask (B, M), 1 = real token. Returns (B, T, D) and,
        when asked, the self-attention (B, H, T, T_all) and cross-attention (B, H, T, M) probabilities."""
        y, self_map = self._self_attn(self.attn_input(x), cache, return_attention)
        x = self.attn_residual(x, y)
        kv = None if cache is None else cache.cross_kv
        y, cross_map = self.cross_attn(self.cross_norm(x) if self.norm_first else x, memory, memory_mask, kv,
                                       return_attention)
        x = x + self.drop_path1(y)
        x = self.ffn(x if self.norm_first else self.cross_norm(x))
        return x, self_map, cross_map


class Decoder(nn.ModuleList):
    """A stack of `DecoderBlock`s, as `Encoder` is of `Block`s (blocks named `0`, `1`, ...; stochastic depth
    rising linearly with depth): (B, T, D) and memory (B, M, D) -> (B, T, D), plus per-block maps when asked."""

    def __init__(self, depth: int, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 drop_rate: float = 0.0, attn_drop_rate: float = 0.0, drop_path_rate: float = 0.0,
                 **block_kwargs) -> None:
        super().__init__(block_stack(DecoderBlock, depth, dim, num_heads, mlp_ratio, qkv_bias, drop_rate,
                                     attn_drop_rate, drop_path_rate, **block_kwargs))

    def init_cache(self, memory: torch.Tensor, memory_mask: torch.Tensor | None = None) -> DecoderCache:
        """A cache for decoding against `memory` (B, M, D): every block's cross-attention keys and values,
        computed here once; the self-attention caches start empty."""
        layers = [LayerCache(cross_kv=blk.cross_attn.memory_kv(memory)) for blk in self]
        return DecoderCache(layers, None if memory_mask is None else memory_mask.bool())

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None,
        memory_mask: torch.Tensor | None = None,
        cache: DecoderCache | None = None,
        return_attention: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """x (B, T, D). With a `cache`, x is the next token(s) and memory may be None. Returns the last block's
        output and, when asked, one self-attention and one cross-attention map per block."""
        if cache is not None:
            memory_mask = cache.memory_mask
        self_maps: list[torch.Tensor] = []
        cross_maps: list[torch.Tensor] = []
        for i, blk in enumerate(self):
            x, s, c = blk(x, memory, memory_mask, None if cache is None else cache.layers[i], return_attention)
            if return_attention:
                self_maps.append(s)
                cross_maps.append(c)
        if cache is not None:
            cache.length += x.shape[1]
        return x, self_maps, cross_maps


class TextDecoder(nn.Module):
    """The decoder on target token ids: (B, T) ids and a memory (B, M, D) -> next-token logits (B, T, vocab).

    Token embedding + positions (learned or fixed sinusoids, at most `max_len`) -> `Decoder` -> final norm ->
    `head`. A pre-norm stack needs the final norm; a post-norm one has none unless `final_norm=True`
    (`nn.Transformer` always has one). `init_cache` and `forward(..., cache=)` decode incrementally: positions
    continue from `cache.length`."""

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int = 256,
        depth: int = 4,
        num_heads: int = 4,
        max_len: int = 128,
        mlp_ratio: float = 4.0,
        pos_embed: Literal["learn", "sincos"] = "learn",
        norm_first: bool = True,
        final_norm: bool | None = None,
        norm_layer: str = "layernorm",
        norm_eps: float = 1e-6,
        mlp_layer: str = "gelu",
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        fused_attn: bool = True,
    ) -> None:
        super().__init__()
        check_text_sizes("TextDecoder", vocab_size, embed_dim, depth, num_heads, max_len, norm_eps)
        if pos_embed not in ("learn", "sincos"):
            raise ValueError(f"unknown pos_embed {pos_embed!r}; choose 'learn' or 'sincos'.")
        norm = get_norm_layer(norm_layer, norm_eps)
        self.max_len = max_len
        self.token_embed = nn.Embedding(vocab_size, embed_dim)
        add_pos_embed_1d(self, pos_embed, max_len, embed_dim)
        self.drop = nn.Dropout(drop_rate)
        self.blocks = Decoder(depth, embed_dim, num_heads, mlp_ratio, True, drop_rate, attn_drop_rate,
                              drop_path_rate, norm_layer=norm, mlp_layer=mlp_layer, norm_first=norm_first,
                              fused_attn=fused_attn)
        self.norm = norm(embed_dim) if (norm_first if final_norm is None else final_norm) else nn.Identity()
        self.head = nn.Linear(embed_dim, vocab_size)

    def init_cache(self, memory: torch.Tensor, memory_mask: torch.Tensor | None = None) -> DecoderCache:
        return self.blocks.init_cache(memory, memory_mask)

    def embed(self, ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        """(B, t) ids at positions start .. start + t - 1 -> (B, t, D) token + position embeddings."""
        end = start + ids.shape[1]
        if end > self.max_len:
            raise ValueError(f"a target of {end} tokens is longer than max_len={self.max_len}; build the decoder "
                             "with a larger max_len or generate fewer tokens.")
        return self.drop(self.token_embed(ids) + self.pos_embed[:, start:end])

    def forward_features(
        self,
        ids: torch.Tensor,
        memory: torch.Tensor | None,
        memory_mask: torch.Tensor | None = None,
        cache: DecoderCache | None = None,
        return_attention: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """(B, t) ids -> normalized states (B, t, D) and, when asked, the per-block self/cross maps."""
        x = self.embed(ids, 0 if cache is None else cache.length)
        x, self_maps, cross_maps = self.blocks(x, memory, memory_mask, cache, return_attention)
        return self.norm(x), self_maps, cross_maps

    def forward(
        self,
        ids: torch.Tensor,
        memory: torch.Tensor | None,
        memory_mask: torch.Tensor | None = None,
        cache: DecoderCache | None = None,
    ) -> torch.Tensor:
        """Next-token logits (B, t, vocab): for the whole target (teacher forcing) or, with a cache, the new ids."""
        return self.head(self.forward_features(ids, memory, memory_mask, cache)[0])
