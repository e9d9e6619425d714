"""The shared encoder on text tokens: token ids -> per-token states and a pooled vector.

Token embedding + position embedding (learned, or the fixed sinusoids of Vaswani et al., 2017, section 3.5)
-> the very same `Encoder`/`Block` classes as the Vision Transformer -> final norm. Padding positions are
masked out of attention (keys) and out of mean pooling; `causal=True` lets each token see only its past
(decoder-style use). `load_torch_encoder` copies weights from PyTorch's `nn.TransformerEncoder`, which also
serves as our numerical oracle in the tests.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..layers import Mlp, get_norm_layer, sincos_1d
from .encoder import Encoder

__all__ = ["TextEncoder", "TextEncoderOutput"]


@dataclass
class TextEncoderOutput:
    last_hidden_state: torch.Tensor  # (B, N, D), N including the [CLS] slot when there is one
    pooler_output: torch.Tensor  # (B, D)
    attentions: list[torch.Tensor] | None = None  # one (B, H, N, N) map per block when asked


# The spellings before timm's vocabulary was adopted; accepted for one release with a DeprecationWarning.
_OLD_POOL = {"cls": "token", "mean": "avg"}


class TextEncoder(nn.Module):
    """The shared encoder on token ids: (B, N) ids -> `TextEncoderOutput` with per-token states (B, N', D) and a
    pooled vector (B, D), N' = N plus one [CLS] slot with `class_token=True`.

    The options are named as on `VisionTransformer` (timm's vocabulary): `class_token` prepends a learned [CLS]
    token, `global_pool="token"` pools it and `"avg"` averages the real (unpadded) tokens; `norm_layer`,
    `norm_eps`, `mlp_layer`, `norm_first` and the drop rates configure the same `Encoder` as the image model.
    Positions are learned (`pos_embed="learn"`), fixed sinusoids (`"sincos"`) or absent (`"none"`), for at most
    `max_len` tokens. The older keywords `cls_token=` and `pool="cls"|"mean"` still work for one release, with a
    DeprecationWarning naming the new spelling.
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
        global_pool: Literal["token", "avg"] = "avg",
        causal: bool = False,
        norm_first: bool = True,
        norm_layer: str = "layernorm",
        norm_eps: float = 1e-6,
        mlp_layer: str = "gelu",
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        fused_attn: bool = True,
        *,
        cls_token: bool | None = None,
        pool: str | None = None,
    ) -> None:
        super().__init__()
        if cls_token is not None:
            warnings.warn("TextEncoder(cls_token=...) is now class_token=... (timm's name, as on VisionTransformer); "
                          "the old keyword goes in the next release.", DeprecationWarning, stacklevel=2)
            class_token = cls_token
        if pool is not None:
            warnings.warn(f"TextEncoder(pool={pool!r}) is now global_pool={_OLD_POOL.get(pool, pool)!r} (timm's "
                          "names, as on VisionTransformer); the old keyword goes in the next release.",
                          DeprecationWarning, stacklevel=2)
            global_pool = _OLD_POOL.get(pool, pool)
        elif global_pool in _OLD_POOL:  # the old values given positionally or as global_pool
            warnings.warn(f"global_pool={global_pool!r} is now {_OLD_POOL[global_pool]!r} (timm's name); the old "
                          "value goes in the next release.", DeprecationWarning, stacklevel=2)
            global_pool = _OLD_POOL[global_pool]
        if global_pool not in ("token", "avg"):
            raise ValueError(f"unknown global_pool {global_pool!r}; choose 'token' or 'avg'.")
        if global_pool == "token" and not class_token:
            raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg' without it.")
        if pos_embed not in ("learn", "sincos", "none"):
            raise ValueError(f"unknown pos_embed {pos_embed!r}; choose 'learn', 'sincos' or 'none'.")
        norm = get_norm_layer(norm_layer, norm_eps)
        self.global_pool, self.causal, self.max_len = global_pool, causal, max_len
        self.num_prefix_tokens = 1 if class_token else 0
        n_pos = max_len + self.num_prefix_tokens

        self.token_embed = nn.Embedding(vocab_size, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        if pos_embed == "learn":
            self.pos_embed = nn.Parameter(torch.randn(1, n_pos, embed_dim) * 0.02)
        elif pos_embed == "sincos":
            self.register_buffer("pos_embed", sincos_1d(n_pos, embed_dim)[None], persistent=False)
        else:
            self.register_buffer("pos_embed", torch.zeros(1, n_pos, embed_dim), persistent=False)
        self.drop = nn.Dropout(drop_rate)
        self.blocks = Encoder(
            depth, embed_dim, num_heads, mlp_ratio, True, drop_rate, attn_drop_rate, drop_path_rate,
            norm_layer=norm, mlp_layer=mlp_layer, norm_first=norm_first, fused_attn=fused_attn,
        )
        self.norm = norm(embed_dim) if norm_first else nn.Identity()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        return_attention: bool = False,
    ) -> TextEncoderOutput:
        """input_ids (B, N) int; attention_mask (B, N), 1 for real tokens and 0 for padding."""
        B, N = input_ids.shape
        if N > self.max_len:
            raise ValueError(f"sequence of {N} tokens is longer than max_len={self.max_len}; truncate it.")
        x = self.token_embed(input_ids)  # (B, N, D)
        keep = None if attention_mask is None else attention_mask.bool()
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)
            if keep is not None:
                keep = torch.cat([keep.new_ones(B, 1), keep], dim=1)
        x = self.drop(x + self.pos_embed[:, : x.shape[1]])
        x, attentions = self.blocks(x, mask=keep, is_causal=self.causal, return_attention=return_attention)
        x = self.norm(x)
        if self.global_pool == "token":
            pooled = x[:, 0]
        elif keep is None:
            pooled = x[:, self.num_prefix_tokens :].mean(dim=1)
        else:  # mean over real tokens only: padding contributes nothing
            w = keep[:, self.num_prefix_tokens :, None].to(x.dtype)  # (B, N, 1)
            pooled = (x[:, self.num_prefix_tokens :] * w).sum(1) / w.sum(1).clamp(min=1)
        return TextEncoderOutput(x, pooled, attentions if return_attention else None)

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
