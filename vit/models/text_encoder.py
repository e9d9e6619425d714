"""The shared encoder on text tokens: token ids -> per-token states and a pooled vector.

Token embedding + position embedding (learned, or the fixed sinusoids of Vaswani et al., 2017, section 3.5)
[+ token-type embedding] [-> LayerNorm] -> the very same `Encoder`/`Block` classes as the Vision Transformer
-> final norm (pre-norm) -> pooling [-> dense + tanh]. The bracketed parts and the pooling choices are what the
pretrained text families need around the shared blocks (BERT, Devlin et al., 2019, section 3: the embedding sum
with segment embeddings, normalised, and [CLS]'s state through a tanh layer; RoBERTa's positions counted from
its padding id; CLIP's text tower, Radford et al., 2021: causal, pooled at the end-of-text token); the text
loader builds them from a Hugging Face config (vit/models/text_build.py). Padding positions are masked out
of attention (keys) and out of mean pooling; `causal=True` lets each token see only its past.
`load_torch_encoder` copies weights from PyTorch's `nn.TransformerEncoder`, which also serves as our numerical
oracle in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from ..config import SparseOptions
from ..layers import Mlp, add_pos_embed_1d, get_norm_layer
from .encoder import Encoder

__all__ = ["POOLS", "TanhPooler", "TextEncoder", "TextEncoderOutput", "check_text_sizes"]


@dataclass
class TextEncoderOutput:
    """What Hugging Face's text models return, under their names (`out.last_hidden_state`, `out.pooler_output`)."""

    last_hidden_state: torch.Tensor  # (B, N, D), N including the [CLS] slot when there is one
    pooler_output: torch.Tensor  # (B, D)
    attentions: list[torch.Tensor] | None = None  # one (B, H, N, N) map per block when asked


POOLS = ("token", "avg", "first", "eos")


class TanhPooler(nn.Module):
    """BERT's pooler: the pooled state through dense + tanh, (B, D) -> (B, D) (Devlin et al., 2019, section 3)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.act = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


def check_text_sizes(owner: str, vocab_size: int, embed_dim: int, depth: int, num_heads: int, max_len: int,
                     norm_eps: float) -> None:
    """A text model's sizes, refused in one sentence before anything is built: whole positive counts (depth may be
    0), heads that divide the width, and a norm eps that is finite and positive (a NaN or negative one gives NaN
    outputs). For `TextEncoder` and `TextDecoder` alike."""
    least = {"vocab_size": 1, "embed_dim": 1, "num_heads": 1, "max_len": 1, "depth": 0}
    values = {"vocab_size": vocab_size, "embed_dim": embed_dim, "num_heads": num_heads, "max_len": max_len,
              "depth": depth}
    for key, value in values.items():
        if type(value) is not int or value < least[key]:  # not bool, not 4.0
            raise ValueError(f"{owner}: {key}={value!r} is not a whole number of at least {least[key]}; pass one.")
    if embed_dim % num_heads:
        raise ValueError(f"{owner}: embed_dim={embed_dim} is not a multiple of num_heads={num_heads}; each head "
                         "takes an equal share of the width, so change one of them.")
    if type(norm_eps) not in (int, float) or not 0 < norm_eps < 1:  # `not`: NaN fails too
        raise ValueError(f"{owner}: norm_eps={norm_eps!r} is not a finite number between 0 and 1; pass e.g. 1e-6.")


class TextEncoder(nn.Module):
    """The shared encoder on token ids: (B, N) ids -> `TextEncoderOutput` with per-token states (B, N', D) and a
    pooled vector (B, D), N' = N plus one [CLS] slot with `class_token=True`.

    The options are named as on `VisionTransformer` (timm's vocabulary): `class_token` prepends a learned [CLS]
    token, `global_pool="token"` pools it and `"avg"` averages the real (unpadded) tokens; `norm_layer`,
    `norm_eps`, `mlp_layer`, `norm_first` and the drop rates configure the same `Encoder` as the image model.
    Positions are learned (`pos_embed="learn"`), fixed sinusoids (`"sincos"`) or absent (`"none"`), `max_len`
    rows of them. `sparse_attention` (a `SparseOptions` or its mapping) makes every
    block attend to the top-k key blocks only (vit.layers.sparse_attention).

    What pretrained text models add (all off by default, so the model above is unchanged):
      type_vocab_size       token-type (segment) embeddings added to the sum, BERT's sentence A / B (0: none)
      pre_norm              a norm after the embedding sum (BERT, RoBERTa, DistilBERT; timm's `norm_pre`)
      position_padding_idx  RoBERTa's positions: real tokens count from position_padding_idx + 1, padding
                            sits at position_padding_idx (`cumsum(ids != pad) * (ids != pad) + pad`), so a
                            sequence may hold max_len - position_padding_idx - 1 tokens
      global_pool="first"   the first token's state ([CLS] as vocabulary id, BERT), no learned token needed
      global_pool="eos"     the state at the first `eos_token_id` (CLIP); eos_token_id=None: at the highest id
                            in the row (the original CLIP configs, whose end-of-text is the last vocabulary id)
      pooler                BERT's dense + tanh on the pooled state (`pooler.fc`)
      mlp_layer             also 'gelu_tanh' (BERT's "gelu_new") and 'quick_gelu' (CLIP)
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int = 256,
        depth: int = 4,
        num_heads: int = 4,
        max_len: int = 512,
        mlp_ratio: float = 4.0,
        pos_embed: Literal["learn", "sincos", "none"] = "learn",
        class_token: bool = False,
        global_pool: Literal["token", "avg", "first", "eos"] = "avg",
        causal: bool = False,
        norm_first: bool = True,
        norm_layer: str = "layernorm",
        norm_eps: float = 1e-6,
        mlp_layer: str = "gelu",
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        fused_attn: bool = True,
        sparse_attention: SparseOptions | dict | None = None,
        *,
        type_vocab_size: int = 0,
        pre_norm: bool = False,
        position_padding_idx: int | None = None,
        eos_token_id: int | None = None,
        pooler: bool = False,
    ) -> None:
        super().__init__()
        check_text_sizes("TextEncoder", vocab_size, embed_dim, depth, num_heads, max_len, norm_eps)
        if global_pool not in POOLS:
            raise ValueError(f"unknown global_pool {global_pool!r}; choose one of {', '.join(map(repr, POOLS))}.")
        if global_pool == "token" and not class_token:
            raise ValueError("global_pool='token' needs class_token=True; without it use global_pool='first' (the "
                             "first input token, e.g. BERT's [CLS] id) or 'avg'.")
        if pos_embed not in ("learn", "sincos", "none"):
            raise ValueError(f"unknown pos_embed {pos_embed!r}; choose 'learn', 'sincos' or 'none'.")
        if position_padding_idx is not None and (class_token or not 0 <= position_padding_idx < max_len - 1):
            raise ValueError(f"position_padding_idx={position_padding_idx} needs 0 <= it < max_len - 1 = "
                             f"{max_len - 1} and no class_token (RoBERTa-style positions count real tokens).")
        norm = get_norm_layer(norm_layer, norm_eps)
        self.global_pool, self.causal, self.max_len = global_pool, causal, max_len
        self.vocab_size, self.eos_token_id, self.position_padding_idx = vocab_size, eos_token_id, position_padding_idx
        self.num_prefix_tokens = 1 if class_token else 0
        self.num_features = self.embed_dim = embed_dim  # the width of the pooled vector, as the ViT's
        n_pos = max_len + self.num_prefix_tokens

        self.token_embed = nn.Embedding(vocab_size, embed_dim)
        self.type_embed = nn.Embedding(type_vocab_size, embed_dim) if type_vocab_size else None
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        add_pos_embed_1d(self, pos_embed, n_pos, embed_dim)
        self.norm_pre = norm(embed_dim) if pre_norm else nn.Identity()
        self.drop = nn.Dropout(drop_rate)
        self.blocks = Encoder(
            depth, embed_dim, num_heads, mlp_ratio, True, drop_rate, attn_drop_rate, drop_path_rate,
            norm_layer=norm, mlp_layer=mlp_layer, norm_first=norm_first, fused_attn=fused_attn,
            sparse_attention=SparseOptions.of(sparse_attention),
        )
        self.norm = norm(embed_dim) if norm_first else nn.Identity()
        self.pooler = TanhPooler(embed_dim) if pooler else nn.Identity()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        return_attention: bool = False,
    ) -> TextEncoderOutput:
        """input_ids (B, N) int; attention_mask (B, N), 1 for real tokens and 0 for padding; token_type_ids
        (B, N), the segment of each token (0 when not given; ignored by a model without token types, as
        DistilBERT and CLIP have none). Called as Hugging Face's text models are: `model(**tokenizer(texts))`."""
        B, N = input_ids.shape
        self._check_ids(input_ids, token_type_ids)
        x = self.token_embed(input_ids)  # (B, N, D)
        if self.type_embed is not None:
            x = x + (self.type_embed.weight[0] if token_type_ids is None else self.type_embed(token_type_ids))
        keep = None if attention_mask is None else attention_mask.bool()
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)
            if keep is not None:
                keep = torch.cat([keep.new_ones(B, 1), keep], dim=1)
        if self.position_padding_idx is None:
            x = x + self.pos_embed[:, : x.shape[1]]
        else:  # RoBERTa: real tokens at pad+1, pad+2, ...; padding (by id, as Hugging Face) at pad itself
            real = (input_ids != self.position_padding_idx).long()
            x = x + self.pos_embed[0, real.cumsum(1) * real + self.position_padding_idx]
        x = self.drop(self.norm_pre(x))
        x, attentions = self.blocks(x, mask=keep, is_causal=self.causal, return_attention=return_attention)
        x = self.norm(x)
        return TextEncoderOutput(x, self.pooler(self._pool(x, input_ids, keep)),
                                 attentions if return_attention else None)

    def _pool(self, x: torch.Tensor, input_ids: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """(B, N', D) states -> (B, D), as `global_pool` says."""
        if self.global_pool in ("token", "first"):
            return x[:, 0]
        if self.global_pool == "eos":  # the first end-of-text token of each row, as Hugging Face's CLIP
            at = (input_ids == self.eos_token_id).int().argmax(1) if self.eos_token_id is not None \
                else input_ids.argmax(1)
            return x[torch.arange(x.shape[0], device=x.device), at + self.num_prefix_tokens]
        if keep is None:
            return x[:, self.num_prefix_tokens :].mean(dim=1)
        w = keep[:, self.num_prefix_tokens :, None].to(x.dtype)  # (B, N, 1): padding contributes nothing
        return (x[:, self.num_prefix_tokens :] * w).sum(1) / w.sum(1).clamp(min=1)

    def _check_ids(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> None:
        """One sentence for ids the embeddings cannot look up (PyTorch's own error is an index error deep in C)."""
        N = input_ids.shape[1]
        limit = self.max_len - (0 if self.position_padding_idx is None else self.position_padding_idx + 1)
        if N > limit:
            raise ValueError(f"sequence of {N} tokens is longer than max_len={limit}; truncate it "
                             "(a tokenizer's truncation=True, max_length=...).")
        if input_ids.is_floating_point():
            raise ValueError(f"input_ids must be integer token ids, not {input_ids.dtype}; pass the tokenizer's ids.")
        if torch.jit.is_scripting() or torch.jit.is_tracing() or torch.compiler.is_compiling() \
                or isinstance(input_ids, torch.fx.Proxy) or input_ids.numel() == 0:
            return  # the value checks below read the ids: eager only
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= self.vocab_size:
            raise ValueError(f"token id {hi if hi >= self.vocab_size else lo} is outside this model's vocabulary of "
                             f"{self.vocab_size} ids; tokenize with the model's own tokenizer.")
        if token_type_ids is not None and self.type_embed is not None and token_type_ids.numel():
            n = self.type_embed.num_embeddings
            if int(token_type_ids.min()) < 0 or int(token_type_ids.max()) >= n:
                raise ValueError(f"token_type_ids must lie in 0..{n - 1} (this model has {n} token types).")

    @torch.no_grad()
    def load_torch_encoder(self, torch_encoder: nn.TransformerEncoder) -> None:
        """Copy the weights of a `nn.TransformerEncoder` into this model's blocks (and final norm), refusing with
        one sentence any encoder that would compute something else with them: another depth, width or head
        count, norm placement (`norm_first`), norm eps (PyTorch's default is 1e-5, ours 1e-6: build this model
        with norm_eps=1e-5), activation (PyTorch's default is ReLU; our MLP is GELU, erf form: build the torch
        layers with activation="gelu"), a SwiGLU MLP or RMSNorm here (PyTorch's layers have neither), missing
        biases, or a final norm on one side only. Nothing is copied unless everything matches. Token and
        position embeddings are this model's own (PyTorch's encoder has none)."""
        layers = list(torch_encoder.layers)
        if len(layers) != len(self.blocks):
            raise ValueError(f"the torch encoder has {len(layers)} layers, this model {len(self.blocks)}; build "
                             "this model with the same depth.")
        for i, (layer, blk) in enumerate(zip(layers, self.blocks)):
            _check_torch_layer(layer, blk, i)
        final = torch_encoder.norm
        if (final is None) != isinstance(self.norm, nn.Identity):
            raise ValueError("the torch encoder " + ("has no final norm, this model has one (pre-norm): pass "
                             "norm=nn.LayerNorm(D) to nn.TransformerEncoder" if final is None else "ends in a norm "
                             "this post-norm model does not have: build it without norm=") + ".")
        if final is not None:
            _check_norm(final, self.norm, "the final norm")
        for layer, blk in zip(layers, self.blocks):
            sa = layer.self_attn
            blk.attn.qkv.weight.copy_(sa.in_proj_weight)
            blk.attn.qkv.bias.copy_(sa.in_proj_bias)
            blk.attn.proj.weight.copy_(sa.out_proj.weight)
            blk.attn.proj.bias.copy_(sa.out_proj.bias)
            blk.mlp.fc1.load_state_dict(layer.linear1.state_dict())
            blk.mlp.fc2.load_state_dict(layer.linear2.state_dict())
            blk.norm1.load_state_dict(layer.norm1.state_dict())
            blk.norm2.load_state_dict(layer.norm2.state_dict())
        if final is not None:
            self.norm.load_state_dict(final.state_dict())


def _is_exact_gelu(act) -> bool:
    """PyTorch's layer stores its activation as F.gelu / F.relu or as the module it was given."""
    return act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none")


def _check_torch_layer(layer: nn.TransformerEncoderLayer, blk: nn.Module, i: int) -> None:
    """Raise ValueError (one sentence) if `layer`'s weights would compute something else in our `blk`."""
    where = f"torch encoder layer {i}"
    if not isinstance(blk.mlp, Mlp):
        raise ValueError(f"this model's MLP is {type(blk.mlp).__name__}, which nn.TransformerEncoderLayer does not "
                         "have; build this model with mlp_layer='gelu'.")
    if not _is_exact_gelu(blk.mlp.act):
        raise ValueError(f"this model's MLP uses {type(blk.mlp.act).__name__}, nn.TransformerEncoderLayer's GELU is "
                         "the erf form; build this model with mlp_layer='gelu'.")
    if not _is_exact_gelu(layer.activation):
        name = getattr(layer.activation, "__name__", None) or repr(layer.activation)  # F.relu, or GELU(...)
        raise ValueError(f"{where} uses activation {name}, this model's MLP uses GELU (erf form); build the torch "
                         "layers with activation='gelu' (PyTorch's default is ReLU).")
    if layer.norm_first != blk.norm_first:
        raise ValueError(f"{where} has norm_first={layer.norm_first}, this model norm_first={blk.norm_first}; "
                         "build this model with the torch encoder's norm placement.")
    sa = layer.self_attn
    if sa.embed_dim != blk.attn.qkv.in_features or layer.linear1.out_features != blk.mlp.fc1.out_features:
        raise ValueError(f"{where} has width {sa.embed_dim} and MLP width {layer.linear1.out_features}, this model "
                         f"{blk.attn.qkv.in_features} and {blk.mlp.fc1.out_features}; match embed_dim and mlp_ratio.")
    if sa.num_heads != blk.attn.num_heads:
        raise ValueError(f"{where} has {sa.num_heads} attention heads, this model {blk.attn.num_heads}; build this "
                         "model with the same num_heads.")
    if any(b is None for b in (sa.in_proj_bias, layer.linear1.bias, layer.linear2.bias)) or \
            sa.in_proj_weight is None:
        raise ValueError(f"{where} was built with bias=False (or separate q/k/v sizes); this model's projections "
                         "all have biases, so it cannot hold those weights.")
    for name in ("norm1", "norm2"):
        _check_norm(getattr(layer, name), getattr(blk, name), f"{where}'s {name}")


def _check_norm(theirs: nn.Module, ours: nn.Module, what: str) -> None:
    if type(theirs) is not type(ours):
        raise ValueError(f"{what} is {type(theirs).__name__}, this model's is {type(ours).__name__}; build this model "
                         f"with norm_layer='{'rmsnorm' if isinstance(theirs, nn.RMSNorm) else 'layernorm'}'.")
    if theirs.eps != ours.eps:
        raise ValueError(f"{what} has eps={theirs.eps:g}, this model's {ours.eps:g}; build this model with "
                         f"norm_eps={theirs.eps:g} (PyTorch's default is 1e-5).")
    if getattr(theirs, "bias", None) is None and getattr(ours, "bias", None) is not None or \
            (theirs.weight is None) != (ours.weight is None):
        raise ValueError(f"{what} lacks a weight or bias this model's norm has; build it with the defaults.")
