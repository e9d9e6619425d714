"""The Vision Transformer (Dosovitskiy et al., 2021, "An Image is Worth 16x16 Words", eqs. 1-4).

    z0 = [x_cls; x_p^1 E; ...; x_p^N E] + E_pos           patches -> tokens, [CLS] first     (eq. 1)
    z_l = Encoder(z_{l-1})                                the shared pre-norm stack          (eqs. 2-3)
    y  = Head(Norm(z_L^0))                                [CLS] (or mean of patch tokens)    (eq. 4)

Parameter names and shapes match timm's `VisionTransformer`, so `load_state_dict(timm_model.state_dict())`
works with strict=True and timm serves as the numerical oracle. The API is timm's too (1.0.31): `forward(x,
attn_mask=None, is_causal=False)`, `forward_features`, `forward_head`, `forward_intermediates`,
`prune_intermediate_layers`, `feature_info`, `reset_classifier`, `group_matcher`, `pretrained_cfg`, ..., so code
written for timm's ViT runs unchanged; the default forward traces with torch.fx and compiles with TorchScript.
Attention maps come from a separate method, `forward_with_attention`, whose return type never changes.
"""

from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.fx
from torch import nn

from ..config import AttentionOptions, options_from
from ..layers import (
    Attention,
    AttentionPoolLatent,
    BlockParts,
    Pooling,
    PrefixTokens,
    RelPos,
    Rope,
    Stem,
    check_combination,
    get_mlp_layer,
    get_norm_layer,
    patch_embedding,
    pool_tokens,
    rel_pos_layers,
    resample_abs_pos_embed,
    rotary_embedding,
    sincos_2d,
)
from .encoder import Encoder
from .features import FeatureIntermediates
from .vit_api import ModelApi

__all__ = ["VisionTransformer"]


def check_img_size(x: torch.Tensor, img_size: tuple[int, int]) -> None:
    """A fixed-size model refuses another input size with a sentence (an FX leaf: no branch in traced graphs)."""
    H, W = x.shape[-2], x.shape[-1]
    if H != img_size[0] or W != img_size[1]:
        raise ValueError(
            f"input size {H}x{W} differs from the model's {img_size[0]}x{img_size[1]}; resize the input, call "
            f"model.set_input_size(({H}, {W})), or build the model with dynamic_img_size=True (positions are then "
            "resampled on the fly; not for a relative position bias)."
        )


torch.fx.wrap("check_img_size")


def _check_options(prefix: PrefixTokens, pooling: Pooling, pos_embed: str, rope: Rope | dict | None,
                   rel_pos: RelPos | dict | None, dynamic_img_size: bool) -> tuple[Rope | None, RelPos | None]:
    """The constructor's options checked together, one sentence per conflict; mappings made options objects."""
    pooling.check(prefix.class_token)
    if prefix.dist_token and pooling.global_pool != "token":
        raise ValueError("dist_token=True needs global_pool='token': DeiT's heads read [CLS] and [DIST].")
    if pos_embed not in ("learn", "sincos", "none"):
        raise ValueError(f"unknown pos_embed {pos_embed!r}; choose 'learn', 'sincos' or 'none'.")
    check_combination(rel_pos=rel_pos is not None, dynamic_img_size=dynamic_img_size)
    return options_from(Rope, rope, "rope"), options_from(RelPos, rel_pos, "rel_pos")


class VisionTransformer(ModelApi, FeatureIntermediates, nn.Module):
    """The Vision Transformer: images (B, C, H, W) -> logits (B, num_classes). Patches of `patch_size` (after a
    convolutional `stem`, vit.layers.hybrid_embed.Stem, in hybrid models) become
    D = `embed_dim` tokens (`patch_embed`), a [CLS] token is prepended (`class_token`), positions are added
    (`pos_embed`: learned, or big_vision's fixed 2-D sine-cosine), `depth` shared `Block`s with `num_heads`
    heads transform the (B, prefix + h*w, D) sequence, and the head pools it. Two options objects choose the
    rest: `prefix` (vit.layers.PrefixTokens: [CLS], registers, DeiT's distillation token, positions for them or
    not) and `pooling` (vit.layers.Pooling: [CLS], average, max, attention pooling; where the final norm is).
    `parts` (vit.layers.BlockParts) adds Eva's, NormFormer's and AIMv2's optional norms, biases and saved names.
    `pre_norm` adds CLIP's norm after the embeddings (and drops the patch projection's bias, as timm). Other
    options and parameter names are timm's (plus `norm_first`, `norm_layer`, `norm_eps`, `mlp_layer`,
    `pos_embed`, `rope` and `rel_pos`, rotary positions and relative position bias, see vit.layers.rope /
    rel_pos, and `stem`, a convolutional stem, see vit.layers.hybrid_embed). The attention is chosen per block:
    `attention` (vit.config.AttentionOptions: qkv bias, QK-norm, fused or explicit, sparse) and `attn_layer`
    (`Attention` or a subclass keeping its contract, docs/contributing.md; or timm's name, 'diff' for
    vit.layers.DiffAttention) and `block_layer` ('block', timm's 'parallel' / 'diff_parallel' blocks of
    vit/models/parallel_block.py, or a class) each take one value or one per block.
    `vit.create_model` builds named variants and takes timm's keywords (`class_token`, `reg_tokens`,
    `global_pool`, `fc_norm`, `qkv_bias`, `qk_norm`, ...) for the objects' fields; NaFlex inputs are the subclass
    `NaFlexVit` (vit/models/naflex_vit.py).
    """

    __constants__ = ["dynamic_img_size"]  # compile-time constant for TorchScript: the fixed-size path has no branch
    # computed from the model name and timm's registry on first use (importing timm is slow): not for TorchScript
    __jit_unused_properties__ = ["pretrained_cfg", "default_cfg"]

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        pooling: Pooling = Pooling(),  # noqa: B008 (frozen: one shared default is safe)
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        prefix: PrefixTokens = PrefixTokens(),  # noqa: B008 (frozen: one shared default is safe)
        pos_embed: Literal["learn", "sincos", "none"] = "learn",
        pre_norm: bool = False,
        dynamic_img_size: bool = False,
        init_values: float | None = None,
        norm_layer: str = "layernorm",
        norm_eps: float = 1e-6,
        mlp_layer: str = "gelu",
        norm_first: bool = True,
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        attention: AttentionOptions | Sequence[AttentionOptions] = AttentionOptions(),  # noqa: B008 (frozen)
        attn_layer: str | type[nn.Module] | Sequence[str | type[nn.Module]] = Attention,
        block_layer: str | type[nn.Module] | Sequence[str | type[nn.Module]] = "block",
        rope: Rope | dict | None = None,
        layer_scale_names: str = "ls",
        parts: BlockParts = BlockParts(),  # noqa: B008 (frozen: one shared default is safe)
        rel_pos: RelPos | dict | None = None,
        stem: Stem | dict | None = None,
    ) -> None:
        super().__init__()
        rope, rel_pos = _check_options(prefix, pooling, pos_embed, rope, rel_pos, dynamic_img_size)
        norm = get_norm_layer(norm_layer, norm_eps)
        self._set_shape(num_classes, in_chans, embed_dim, prefix, pooling, dynamic_img_size, pos_embed, norm_first)
        self._embeddings(stem, img_size, patch_size, in_chans, pos_embed, pre_norm, norm if parts.embed_norm else None)
        # rotary positions (vit.layers.rope): one table per grid, shared by every block's attention; no weights
        self.rope = None if rope is None else rotary_embedding(rope, embed_dim // num_heads, depth, num_heads)
        # relative position bias (vit.layers.rel_pos): a module per block's attention, or one the blocks share
        self.shared_rel_pos, rel_pos_layer = rel_pos_layers(rel_pos, self.patch_embed.grid_size, num_heads,
                                                            prefix.count)
        self.pos_drop = nn.Dropout(pos_drop_rate)
        self.norm_pre = norm(embed_dim) if pre_norm else nn.Identity()
        self.blocks = Encoder(
            depth, embed_dim, num_heads, mlp_ratio, True, drop_rate, attn_drop_rate, drop_path_rate,
            init_values=init_values, norm_layer=norm, mlp_layer=mlp_layer, norm_first=norm_first,
            attention=attention, attn_layer=attn_layer, block_layer=block_layer, rope=rope,
            layer_scale_names=layer_scale_names, parts=parts, rel_pos=rel_pos_layer,
        )
        # one feature level per block, all at the patch stride (timm's feature_info)
        self.feature_info = [dict(module=f"blocks.{i}", num_chs=embed_dim, reduction=self.patch_embed.reduction)
                             for i in range(depth)]
        self._head(norm, norm_first and pooling.final_norm, mlp_layer, mlp_ratio, num_heads, drop_rate)
        self.init_weights()

    def _set_shape(self, num_classes: int, in_chans: int, embed_dim: int, prefix: PrefixTokens, pooling: Pooling,
                   dynamic_img_size: bool, pos_embed: str, norm_first: bool) -> None:
        """The attributes timm's ViT API reads: widths, token counts, the options objects."""
        self.num_classes, self.in_chans = num_classes, in_chans
        self.prefix, self.pooling = prefix, pooling
        self.global_pool = pooling.global_pool
        # timm's names for the token width: features, pre-logits and embedding are all D in a plain ViT
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_prefix_tokens = prefix.count
        self.pool_skip = 0 if pooling.pool_include_prefix else prefix.count  # tokens before the ones pooled
        self.num_reg_tokens = prefix.reg_tokens
        self.has_class_token, self.no_embed_class = prefix.class_token, prefix.no_embed_class
        self.num_pos_prefix = prefix.embedded  # prefix rows of the position table
        self.head_tokens = 1 + int(prefix.dist_token)  # tokens a 'token' head reads: [CLS] (and [DIST])
        self.dynamic_img_size = dynamic_img_size
        self.pos_embed_type, self.norm_first = pos_embed, norm_first
        self._variant: str | None = None  # the name create_model built, for pretrained_cfg
        self._pretrained_cfg: dict[str, Any] | None = None

    def _embeddings(self, stem: Stem | dict | None, img_size: int | tuple[int, int], patch_size: int | tuple[int, int],
                    in_chans: int, pos_embed: str, pre_norm: bool, embed_norm: Any) -> None:
        """Patches -> tokens: `patch_embed`, the prefix tokens and the position table (eq. 1). CLIP's pre-norm
        follows the patch projection, which then has no bias (timm: bias=not pre_norm); a `stem`
        (vit.layers.hybrid_embed) puts a convolutional network before it."""
        D, prefix = self.embed_dim, self.prefix
        self.patch_embed = patch_embedding(stem, img_size, patch_size, in_chans, D, bias=not pre_norm,
                                           norm_layer=embed_norm)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if prefix.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, D)) if prefix.dist_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, prefix.reg_tokens, D)) if prefix.reg_tokens else None
        if pos_embed == "learn":
            self.pos_embed = nn.Parameter(torch.zeros(1, self.num_pos_prefix + self.patch_embed.num_patches, D))
        elif pos_embed == "sincos":  # fixed: a buffer, not saved, rebuilt for any grid; prefix slots get zeros
            self.register_buffer("pos_embed", self._sincos(self.patch_embed.grid_size), persistent=False)
        else:  # positions come from rotary embeddings only (DINOv3)
            self.pos_embed = None
        self.embeds = None  # NaFlexVit's embeddings (vit/models/naflex_vit.py); the square model has none

    def _head(self, norm: Any, final: bool, mlp_layer: str, mlp_ratio: float, num_heads: int, drop_rate: float
              ) -> None:
        """The final norm, the pooling and the classifier (eq. 4). timm: mean/max pooling normalizes the pooled
        vector (fc_norm) instead of every token (norm); a post-norm stack already ends in a norm (`final` False)."""
        D, pooling = self.embed_dim, self.pooling
        self.norm = norm(D) if final and not pooling.use_fc_norm else nn.Identity()
        self.attn_pool = (AttentionPoolLatent(D, pooling.attn_pool_num_heads or num_heads, get_mlp_layer(
            mlp_layer), norm, pooling.attn_pool_mlp_ratio or mlp_ratio) if pooling.global_pool == "map" else None)
        self.fc_norm = norm(D) if final and pooling.use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(D, self.num_classes) if self.num_classes > 0 else nn.Identity()
        # DeiT's distillation head on [DIST]; averaged with `head` at inference (timm's VisionTransformerDistilled)
        self.head_dist = (nn.Linear(D, self.num_classes) if self.num_classes > 0 else nn.Identity()) \
            if self.prefix.dist_token else None
        self.distilled_training = False  # True (set_distilled_training): training returns both heads' logits
        # forward() of a [CLS]-pooled model runs its last block for [CLS] only; False runs every token (e.g. for
        # hooks that inspect the last block's outputs)
        self.prune_last_block = True

    # --- construction helpers -------------------------------------------------------------------------------

    def rel_pos_modules(self) -> list[nn.Module]:
        """The relative position bias modules (the shared one, or one per block), each built for one grid."""
        own = [b.attn.rel_pos for b in self.blocks if isinstance(getattr(b.attn, "rel_pos", None), nn.Module)]
        return own + ([self.shared_rel_pos] if self.shared_rel_pos is not None else [])

    def _sincos(self, grid: tuple[int, int]) -> torch.Tensor:
        table = sincos_2d(grid, self.embed_dim)  # (h*w, D)
        prefix = table.new_zeros(self.num_pos_prefix, self.embed_dim)
        return torch.cat([prefix, table])[None]  # (1, prefix + h*w, D)

    def init_weights(self) -> None:
        """timm's default ViT init: truncated normal (std 0.02) for linears and positions, tiny [CLS]."""
        if isinstance(self.pos_embed, nn.Parameter):
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        if self.reg_token is not None:
            nn.init.normal_(self.reg_token, std=1e-6)
        if self.dist_token is not None:
            nn.init.trunc_normal_(self.dist_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def grid_size(self, img_size: tuple[int, int] | None = None) -> tuple[int, int]:
        """The patch grid (h, w) for an input of `img_size` (H, W), or for the configured size."""
        if img_size is None:
            return self.patch_embed.grid_size
        return self.patch_embed.dynamic_grid(*img_size)

    # --- forward --------------------------------------------------------------------------------------------

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> tokens (B, prefix + h*w, D): patches, prefix tokens prepended, positions added,
        then the pre-norm (CLIP; nothing elsewhere)."""
        if not torch.jit.is_scripting():  # TorchScript sees tensors only
            if isinstance(x, dict):
                raise TypeError("this model was built without NaFlex and reads images (B, C, H, W); build it with "
                                "naflex=... (e.g. a naflexvit_* architecture) to pass a NaFlex batch.")
        if self.dynamic_img_size:
            grid = self.patch_embed.dynamic_grid(x.shape[-2], x.shape[-1])
        else:
            check_img_size(x, self.patch_embed.img_size)
            grid = self.patch_embed.grid_size
        return self.norm_pre(self._pos_embed(self.patch_embed(x), grid))

    def _pos_embed(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """x: (B, h*w, D) patch tokens -> (B, prefix + h*w, D) with prefix tokens prepended and positions added."""
        pos = self.pos_embed
        if self.dynamic_img_size and pos is not None:
            pos = self._resized_pos_embed(grid).to(x.dtype)
        return self.pos_drop(self.add_positions(x, pos))

    @torch.jit.ignore  # Python inside a scripted model, as _resized_pos_embed
    def rope_table(self, x: torch.Tensor) -> torch.Tensor | None:
        """The rotary table (h*w, 2 * head_dim) for images x (B, C, H, W), or None without rotary positions."""
        if self.rope is None:
            return None
        if isinstance(self.rope, torch.jit.ScriptModule):
            raise RuntimeError("a model with rotary positions runs eagerly or under torch.compile; TorchScript "
                               "cannot compute its rotary tables, so use the unscripted model.")
        grid = self.patch_embed.dynamic_grid(x.shape[-2], x.shape[-1]) if self.dynamic_img_size else \
            self.patch_embed.grid_size
        return self.rope(grid, x.device)

    def add_positions(self, x: torch.Tensor, pos: torch.Tensor | None) -> torch.Tensor:
        """x: (B, h*w, D) patch tokens, pos: (1, num_pos_prefix + h*w, D) -> (B, prefix + h*w, D): [CLS], [DIST],
        registers prepended; positions added to every token, or to the patches only (`no_embed_class`)."""
        B = x.shape[0]
        tokens: list[torch.Tensor] = []
        if self.cls_token is not None:
            tokens.append(self.cls_token.expand(B, -1, -1))
        if self.dist_token is not None:
            tokens.append(self.dist_token.expand(B, -1, -1))
        if self.reg_token is not None:
            tokens.append(self.reg_token.expand(B, -1, -1))
        if self.no_embed_class:
            x = x if pos is None else x + pos
            return torch.cat(tokens + [x], dim=1) if len(tokens) > 0 else x
        if len(tokens) > 0:
            x = torch.cat(tokens + [x], dim=1)
        return x if pos is None else x + pos

    @torch.jit.ignore  # runs as Python inside a scripted model (so a scripted model cannot be saved with it)
    def _resized_pos_embed(self, grid: tuple[int, int]) -> torch.Tensor:
        """(1, prefix + h*w, D) positions for another grid: learned ones resampled, sine-cosine ones rebuilt."""
        if grid == self.patch_embed.grid_size:
            return self.pos_embed
        if self.pos_embed_type == "learn":
            return resample_abs_pos_embed(self.pos_embed, grid, self.patch_embed.grid_size, self.num_pos_prefix)
        return self._sincos(grid).to(self.pos_embed.device)

    @torch.jit.unused
    def encode(
        self,
        x: torch.Tensor,
        patch_keep: torch.Tensor | None = None,
        return_attention: bool = False,
        last_queries: int | None = None,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Images (B, C, H, W) -> normalized tokens (B, prefix + N, D) and the per-block attention maps.

        `patch_keep` (B, K) lists the patch indices (row-major) to keep after positions are added; the others
        are removed from the sequence (token deletion: a ViT takes a shorter sequence natively).
        `last_queries=q` runs the last block for the first q tokens only: (B, q, D).
        """
        rope = self.rope_table(x)
        check_combination(patch_keep=patch_keep is not None, rope=rope is not None,
                          rel_pos=len(self.rel_pos_modules()) > 0)
        x = self._embed(x)  # (B, prefix + h*w, D)
        if patch_keep is not None:
            p = self.num_prefix_tokens
            idx = patch_keep[..., None].expand(-1, -1, x.shape[-1])  # (B, K, D)
            x = torch.cat([x[:, :p], x[:, p:].gather(1, idx)], dim=1)  # (B, prefix + K, D)
        x, attentions = self.blocks(x, attn_mask, is_causal, return_attention, last_queries, rope)
        return self.norm(x), attentions

    def forward_features(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> torch.Tensor:
        """(B, C, H, W) -> (B, prefix + N, D), after the final norm. attn_mask: any form `expand_mask` takes."""
        x, _ = self.blocks(self._embed(x), attn_mask, is_causal, rope=self.rope_table(x))
        return self.norm(x)

    def pool(self, x: torch.Tensor, pool_type: str | None = None) -> torch.Tensor:
        """(B, prefix + N, D) -> (B, D): attention pooling of the patch tokens ('map'), [CLS] ('token'),
        mean/max/both of the patch tokens; '' keeps all (vit.layers.pooling)."""
        if self.attn_pool is not None:
            return self.attn_pool(x[:, self.pool_skip :])
        return pool_tokens(x, self.global_pool if pool_type is None else pool_type, self.pool_skip)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """(B, prefix + N, D) -> pooled (B, D) if pre_logits, else logits (B, num_classes). A distilled model
        averages its two heads ([CLS] and [DIST]); with `set_distilled_training` it returns both while training."""
        if self.head_dist is not None:  # timm's VisionTransformerDistilled.forward_head
            x, x_dist = self.head_drop(x[:, 0]), self.head_drop(x[:, 1])  # [CLS], [DIST]: (B, D) each
            if pre_logits:
                return (x + x_dist) / 2
            x, x_dist = self.head(x), self.head_dist(x_dist)
            if self.distilled_training and self.training and not torch.jit.is_scripting():
                return x, x_dist  # timm's: both logits, for the distillation loss
            return (x + x_dist) / 2
        return self.classify(self.pool(x), pre_logits)

    def classify(self, pooled: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Pooled tokens (B, D) -> fc_norm and dropout (pre-logits), then the head: logits (B, num_classes)."""
        x = self.head_drop(self.fc_norm(pooled))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        """Logits (B, num_classes) (pooled features if num_classes=0; every token if global_pool='').

        A [CLS]-pooled pre-norm classifier reads one token of the last block ([CLS], and [DIST] if distilled), so
        that block is computed for those only (its attention still looks at every token): same logits, ~7% fewer
        FLOPs at 12 blocks."""
        prune = self.prune_last_block and self.global_pool == "token" and self.norm_first and (
            torch.jit.is_scripting() or not (self.training and self._last_block_learns_an_indexer()))
        x, _ = self.blocks(self._embed(x), attn_mask, is_causal, False, self.head_tokens if prune else None,
                           self.rope_table(x))
        return self.forward_head(self.norm(x))

    @torch.jit.unused
    def _last_block_learns_an_indexer(self) -> bool:
        """A DSA last block in training runs every token: a [CLS]-only block attends densely, which would leave its
        indexer without a loss (and DDP, which reduces every trainable parameter, without its gradient)."""
        sparse = getattr(self.blocks[-1].attn, "sparse", None) if len(self.blocks) else None
        return sparse is not None and sparse.indexer is not None and sparse.stage is not None

    @torch.jit.unused
    def forward_with_attention(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits (B, num_classes) and every block's attention probabilities, a list of (B, H, N, N) maps
        (the explicit softmax path; the logits equal forward's). For rollout and inspection."""
        feats, attentions = self.encode(x, return_attention=True, attn_mask=attn_mask, is_causal=is_causal)
        return self.forward_head(feats), attentions
