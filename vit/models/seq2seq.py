"""The encoder-decoder Transformer (Vaswani et al., 2017, figure 1), with the ViT's own encoder.

    source --encoder--> memory (B, M, D)        target <bos> y1 .. y_{T-1} --decoder(memory)--> logits for y1 .. yT

The encoder is the shared `Encoder` behind either a `TextEncoder` (token embeddings + positions, the source's
padding masked) or a `VisionTransformer` (patch tokens: image-to-text); the decoder is a `TextDecoder`, whose
blocks add cross-attention over the memory to the encoder's blocks. Training is teacher forcing: one forward
predicts every next token of the target. `generate` decodes greedily or with beam search, by default through
the KV cache. `load_torch_transformer` copies a `torch.nn.Transformer`, the tests' numerical oracle.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..layers import get_norm_layer
from .decoder import TextDecoder
from .generation import GenerateOutput, beam_search, check_generate_args, check_special_ids, greedy_search
from .text_encoder import TextEncoder

__all__ = ["Seq2Seq"]


class Seq2Seq(nn.Module):
    """An encoder (`TextEncoder`, or a `VisionTransformer` whose tokens are the memory) and a `TextDecoder`.
    `bos_id` starts every target, `eos_id` ends it, `pad_id` fills targets after <eos> (ignored by `loss`)."""

    def __init__(self, encoder: nn.Module, decoder: TextDecoder, bos_id: int = 1, eos_id: int = 2,
                 pad_id: int = 0) -> None:
        super().__init__()
        check_special_ids(bos_id, eos_id, pad_id, decoder.head.out_features)
        if not isinstance(encoder, TextEncoder) and not hasattr(encoder, "forward_features"):
            raise ValueError(f"the encoder is a {type(encoder).__name__}; use a vit.TextEncoder or a model with "
                             "forward_features (a vit.VisionTransformer) whose tokens the decoder reads.")
        if isinstance(encoder, TextEncoder) and encoder.causal:
            raise ValueError("the source encoder is causal; build it with causal=False (every source token may see "
                             "every other).")
        self.encoder, self.decoder = encoder, decoder
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id

    @classmethod
    def text(
        cls,
        src_vocab_size: int,
        tgt_vocab_size: int,
        embed_dim: int = 256,
        depth: int = 3,
        num_heads: int = 4,
        decoder_depth: int | None = None,
        max_src_len: int = 128,
        max_tgt_len: int = 128,
        norm_first: bool = True,
        final_norm: bool | None = None,
        **kwargs,
    ) -> Seq2Seq:
        """A text-to-text model: `depth` encoder blocks over source ids, `decoder_depth` (default `depth`) decoder
        blocks. `final_norm=True` gives a post-norm stack a last norm on both sides, as `nn.Transformer` has;
        `mlp_ratio`, `pos_embed`, `norm_eps`, `norm_layer`, `mlp_layer`, the drop rates and the special ids
        go through `kwargs`."""
        ids = {k: kwargs.pop(k) for k in ("bos_id", "eos_id", "pad_id") if k in kwargs}
        encoder = TextEncoder(src_vocab_size, embed_dim, depth, num_heads, max_len=max_src_len,
                              norm_first=norm_first, **kwargs)
        if final_norm and not norm_first:  # TextEncoder's post-norm stack ends in its last block's norm
            encoder.norm = get_norm_layer(kwargs.get("norm_layer", "layernorm"), kwargs.get("norm_eps", 1e-6))(
                embed_dim)
        decoder = TextDecoder(tgt_vocab_size, embed_dim, depth if decoder_depth is None else decoder_depth,
                              num_heads, max_tgt_len, norm_first=norm_first, final_norm=final_norm, **kwargs)
        return cls(encoder, decoder, **ids)

    def encode(
        self, src: torch.Tensor, src_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Source ids (B, N) with padding mask (B, N) (1 = token), or images (B, C, H, W) -> memory (B, M, D) and
        its padding mask (B, M) or None."""
        if isinstance(self.encoder, TextEncoder):
            memory = self.encoder(src, attention_mask=src_mask).last_hidden_state
            if src_mask is not None and memory.shape[1] > src_mask.shape[1]:  # a [CLS] slot in front
                src_mask = torch.cat([src_mask.new_ones(src_mask.shape[0], 1), src_mask], dim=1)
            return memory, src_mask
        if src_mask is not None:
            raise ValueError("an image encoder's tokens have no padding; call encode without src_mask.")
        return self.encoder.forward_features(src), None

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher forcing: logits (B, T, vocab) for the next token at every position of tgt (B, T) ids."""
        memory, memory_mask = self.encode(src, src_mask)
        return self.decoder(tgt, memory, memory_mask)

    def loss(self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor | None = None,
             label_smoothing: float = 0.0) -> torch.Tensor:
        """Mean cross-entropy of tgt (B, T) = <bos> y1 .. yT <eos> <pad>...: inputs tgt[:, :-1], labels tgt[:, 1:],
        padding ignored. A batch whose labels are all padding has loss 0 (still attached to the graph, so
        backward gives zero gradients): transformers' models return NaN there (a mean over no tokens), which
        would poison every weight at the next step."""
        logits = self(src, tgt[:, :-1], src_mask)
        labels = tgt[:, 1:].flatten()
        total = F.cross_entropy(logits.flatten(0, 1), labels, ignore_index=self.pad_id,
                                label_smoothing=label_smoothing, reduction="sum")
        return total / (labels != self.pad_id).sum().clamp(min=1)

    @torch.no_grad()
    def generate(
        self,
        src: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        max_new_tokens: int | None = None,
        num_beams: int = 1,
        length_penalty: float = 1.0,
        use_cache: bool = True,
    ) -> GenerateOutput:
        """Decode every source: greedy (`num_beams=1`) or beam search, through the KV cache unless
        `use_cache=False` (the whole prefix again at each step: the same tokens, slower). At most
        `max_new_tokens` (default: as many as the decoder's positions allow) ids per source, <eos> included."""
        limit = self.decoder.max_len  # fed: <bos> and all but the last new token, one position each
        max_new_tokens = limit if max_new_tokens is None else max_new_tokens
        check_generate_args(self.decoder, self.bos_id, self.eos_id, self.pad_id, max_new_tokens, num_beams,
                            length_penalty)
        if max_new_tokens > limit:
            raise ValueError(f"max_new_tokens={max_new_tokens} is more than the decoder's max_len "
                             f"{self.decoder.max_len} allows; ask for at most {limit}.")
        memory, memory_mask = self.encode(src, src_mask)
        args = (self.decoder, memory, memory_mask, self.bos_id, self.eos_id, self.pad_id, max_new_tokens)
        if num_beams == 1:
            return greedy_search(*args, length_penalty=length_penalty, use_cache=use_cache)
        return beam_search(*args, num_beams=num_beams, length_penalty=length_penalty, use_cache=use_cache)

    @torch.no_grad()
    def load_torch_transformer(self, transformer: nn.Transformer) -> None:
        """Copy a `torch.nn.Transformer`'s weights into this model's encoder and decoder stacks (embeddings are
        this model's own: nn.Transformer has none). nn.Transformer ends both stacks in a LayerNorm even
        post-norm: build this model with `final_norm=True` then. Anything that would compute something else
        (depth, width, heads, norm placement or eps, activation) is refused in one sentence, before anything
        is copied."""
        if not isinstance(self.encoder, TextEncoder):
            raise ValueError("load_torch_transformer needs a text encoder; this model's encoder is a "
                             f"{type(self.encoder).__name__}.")
        layers, blocks = list(transformer.decoder.layers), list(self.decoder.blocks)
        if len(layers) != len(blocks):
            raise ValueError(f"the torch decoder has {len(layers)} layers, this model {len(blocks)}; build this "
                             "model with the same decoder_depth.")
        for i, (layer, blk) in enumerate(zip(layers, blocks)):
            _check_decoder_layer(layer, blk, i)
        final = transformer.decoder.norm
        if (final is None) != isinstance(self.decoder.norm, nn.Identity):
            raise ValueError("the torch decoder " + ("has no final norm and this model's has one" if final is None
                             else "ends in a norm this model's lacks: build it with final_norm=True") + ".")
        if final is not None and final.eps != self.decoder.norm.eps:
            raise ValueError(f"the torch decoder's final norm has eps={final.eps:g}, this model's "
                             f"{self.decoder.norm.eps:g}; build this model with norm_eps={final.eps:g}.")
        self.encoder.load_torch_encoder(transformer.encoder)  # checks its side, copies nothing on a mismatch
        D = self.decoder.token_embed.embedding_dim
        for layer, blk in zip(layers, blocks):
            sa, ca = layer.self_attn, layer.multihead_attn
            blk.attn.qkv.weight.copy_(sa.in_proj_weight)
            blk.attn.qkv.bias.copy_(sa.in_proj_bias)
            blk.attn.proj.load_state_dict(sa.out_proj.state_dict())
            blk.cross_attn.q.weight.copy_(ca.in_proj_weight[:D])  # in_proj stacks W_q, W_k, W_v (3D, D)
            blk.cross_attn.q.bias.copy_(ca.in_proj_bias[:D])
            blk.cross_attn.kv.weight.copy_(ca.in_proj_weight[D:])
            blk.cross_attn.kv.bias.copy_(ca.in_proj_bias[D:])
            blk.cross_attn.proj.load_state_dict(ca.out_proj.state_dict())
            blk.mlp.fc1.load_state_dict(layer.linear1.state_dict())
            blk.mlp.fc2.load_state_dict(layer.linear2.state_dict())
            # torch: norm1 self-attention, norm2 cross-attention, norm3 FFN
            blk.norm1.load_state_dict(layer.norm1.state_dict())
            blk.cross_norm.load_state_dict(layer.norm2.state_dict())
            blk.norm2.load_state_dict(layer.norm3.state_dict())
        if final is not None:
            self.decoder.norm.load_state_dict(final.state_dict())


def _check_decoder_layer(layer: nn.TransformerDecoderLayer, blk: nn.Module, i: int) -> None:
    """Raise ValueError (one sentence) if `layer`'s weights would compute something else in our `blk`."""
    where = f"torch decoder layer {i}"
    act = layer.activation
    if not (act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none")):
        raise ValueError(f"{where} uses activation {getattr(act, '__name__', repr(act))}, this model's MLP uses "
                         "GELU (erf form); build the torch layers with activation='gelu' (PyTorch's default is ReLU).")
    if layer.norm_first != blk.norm_first:
        raise ValueError(f"{where} has norm_first={layer.norm_first}, this model norm_first={blk.norm_first}; "
                         "build this model with the torch decoder's norm placement.")
    sa = layer.self_attn
    if (sa.embed_dim, layer.linear1.out_features) != (blk.attn.qkv.in_features, blk.mlp.fc1.out_features):
        raise ValueError(f"{where} has width {sa.embed_dim} and MLP width {layer.linear1.out_features}, this model "
                         f"{blk.attn.qkv.in_features} and {blk.mlp.fc1.out_features}; match embed_dim and mlp_ratio.")
    if sa.num_heads != blk.attn.num_heads:
        raise ValueError(f"{where} has {sa.num_heads} attention heads, this model {blk.attn.num_heads}; build this "
                         "model with the same num_heads.")
    if any(b is None for b in (sa.in_proj_bias, layer.multihead_attn.in_proj_bias, layer.linear1.bias)):
        raise ValueError(f"{where} was built with bias=False; this model's projections all have biases.")
    for theirs, ours in ((layer.norm1, blk.norm1), (layer.norm2, blk.cross_norm), (layer.norm3, blk.norm2)):
        if type(theirs) is not type(ours) or theirs.eps != ours.eps:
            raise ValueError(f"{where}'s norms are {type(theirs).__name__}(eps={theirs.eps:g}), this model's "
                             f"{type(ours).__name__}(eps={ours.eps:g}); build this model with norm_eps="
                             f"{theirs.eps:g} (PyTorch's default is 1e-5).")
