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

import dataclasses
import inspect
import typing
from typing import Any, Literal

import torch
import torch.fx
from torch import nn

from ..config import SparseOptions
from ..layers import (
    AttentionPoolLatent,
    PatchEmbed,
    Pooling,
    PrefixTokens,
    Rope,
    RotaryEmbedding,
    build_token_reduction,
    get_mlp_layer,
    get_norm_layer,
    parse_token_reduction,
    pool_tokens,
    resample_abs_pos_embed,
    sincos_2d,
)
from ..layers.sparse_attention import parse_sparse_spec
from .encoder import Encoder
from .features import FeatureIntermediates
from .variants import VARIANTS
from .vision_weights import checkpoint_filter_fn

__all__ = ["VisionTransformer", "OPTIONS", "architecture_defaults", "constructor_kwargs",
           "default_pretrained_cfg", "option_types"]


def check_img_size(x: torch.Tensor, img_size: tuple[int, int]) -> None:
    """A fixed-size model refuses another input size with a sentence (an FX leaf: no branch in traced graphs)."""
    H, W = x.shape[-2], x.shape[-1]
    if H != img_size[0] or W != img_size[1]:
        raise ValueError(
            f"input size {H}x{W} differs from the model's {img_size[0]}x{img_size[1]}; resize the input, or build "
            "the model with dynamic_img_size=True (positions are then resampled on the fly)."
        )


torch.fx.wrap("check_img_size")


class VisionTransformer(FeatureIntermediates, nn.Module):
    """The Vision Transformer: images (B, C, H, W) -> logits (B, num_classes). Patches of `patch_size` become
    D = `embed_dim` tokens (`patch_embed`), a [CLS] token is prepended (`class_token`), positions are added
    (`pos_embed`: learned, or big_vision's fixed 2-D sine-cosine), `depth` shared `Block`s with `num_heads`
    heads transform the (B, prefix + h*w, D) sequence, and the head pools it. Two options objects choose the
    rest: `prefix` (vit.layers.PrefixTokens: [CLS], registers, DeiT's distillation token, positions for them or
    not) and `pooling` (vit.layers.Pooling: [CLS], average, max, attention pooling; where the final norm is).
    `pre_norm` adds CLIP's norm after the embeddings (and drops the patch projection's bias, as timm). Other
    options and parameter names are timm's (plus `norm_first`, `norm_layer`, `norm_eps`, `mlp_layer`,
    `pos_embed`, and `sparse_attention`, a `SparseOptions` or its mapping, see
    vit.layers.sparse_attention); `vit.create_model` builds named variants and takes timm's keywords
    (`class_token`, `reg_tokens`, `global_pool`, `fc_norm`, ...) for the objects' fields.
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
        qkv_bias: bool = True,
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
        fused_attn: bool = True,
        sparse_attention: SparseOptions | dict | None = None,
        rope: Rope | dict | None = None,
        layer_scale_names: str = "ls",
    ) -> None:
        super().__init__()
        pooling.check(prefix.class_token)
        if prefix.dist_token and pooling.global_pool != "token":
            raise ValueError("dist_token=True needs global_pool='token': DeiT's heads read [CLS] and [DIST].")
        if pos_embed not in ("learn", "sincos", "none"):
            raise ValueError(f"unknown pos_embed {pos_embed!r}; choose 'learn', 'sincos' or 'none'.")
        rope = Rope(**rope) if isinstance(rope, dict) else rope
        norm = get_norm_layer(norm_layer, norm_eps)
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.prefix, self.pooling = prefix, pooling
        self.global_pool = pooling.global_pool
        # timm's names for the token width: features, pre-logits and embedding are all D in a plain ViT
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_prefix_tokens = prefix.count
        self.num_reg_tokens = prefix.reg_tokens
        self.has_class_token = prefix.class_token
        self.no_embed_class = prefix.no_embed_class
        self.num_pos_prefix = prefix.embedded  # prefix rows of the position table
        self.head_tokens = 1 + int(prefix.dist_token)  # tokens a 'token' head reads: [CLS] (and [DIST])
        self.dynamic_img_size = dynamic_img_size
        self.pos_embed_type = pos_embed
        self.norm_first = norm_first
        self._variant: str | None = None  # the name create_model built, for pretrained_cfg
        self._pretrained_cfg: dict[str, Any] | None = None

        # CLIP's pre-norm follows the patch projection, which then has no bias (timm: bias=not pre_norm)
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim, bias=not pre_norm)
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if prefix.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if prefix.dist_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, prefix.reg_tokens, embed_dim)) if prefix.reg_tokens else None
        if pos_embed == "learn":
            self.pos_embed = nn.Parameter(torch.zeros(1, self.num_pos_prefix + num_patches, embed_dim))
        elif pos_embed == "sincos":  # fixed: a buffer, not saved, rebuilt for any grid; prefix slots get zeros
            self.register_buffer("pos_embed", self._sincos(self.patch_embed.grid_size), persistent=False)
        else:  # positions come from rotary embeddings only (DINOv3)
            self.pos_embed = None
        # rotary positions (vit.layers.rope): one table per grid, shared by every block's attention; no weights
        self.rope = None if rope is None else RotaryEmbedding(rope, embed_dim // num_heads)
        self.pos_drop = nn.Dropout(pos_drop_rate)
        self.norm_pre = norm(embed_dim) if pre_norm else nn.Identity()

        self.blocks = Encoder(
            depth, embed_dim, num_heads, mlp_ratio, qkv_bias, drop_rate, attn_drop_rate, drop_path_rate,
            init_values=init_values, norm_layer=norm, mlp_layer=mlp_layer, norm_first=norm_first,
            fused_attn=fused_attn, sparse_attention=SparseOptions.of(sparse_attention),
            rope=rope, layer_scale_names=layer_scale_names,
        )
        # one feature level per block, all at the patch stride (timm's feature_info)
        self.feature_info = [
            dict(module=f"blocks.{i}", num_chs=embed_dim, reduction=max(self.patch_embed.patch_size))
            for i in range(depth)
        ]
        # timm: mean/max pooling normalizes the pooled vector (fc_norm) instead of every token (norm). A post-norm
        # stack already ends in a norm, so it gets none here.
        final = norm_first and pooling.final_norm
        self.norm = norm(embed_dim) if final and not pooling.use_fc_norm else nn.Identity()
        self.attn_pool = (AttentionPoolLatent(embed_dim, num_heads, get_mlp_layer(mlp_layer), norm, mlp_ratio)
                          if pooling.global_pool == "map" else None)
        self.fc_norm = norm(embed_dim) if final and pooling.use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        # DeiT's distillation head on [DIST]; averaged with `head` at inference (timm's VisionTransformerDistilled)
        self.head_dist = (nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()) \
            if prefix.dist_token else None
        self.distilled_training = False  # True (set_distilled_training): training returns both heads' logits
        # forward() of a [CLS]-pooled model runs its last block for [CLS] only; False runs every token (e.g. for
        # hooks that inspect the last block's outputs)
        self.prune_last_block = True
        self.init_weights()

    # --- construction helpers -------------------------------------------------------------------------------

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

    # --- timm's model API: what optimizers, feature extractors and training loops read -----------------------

    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        """timm's pretrained config. Set by weights that come with one; otherwise, for a named model, the
        registry's default for that name (as `timm.create_model(name, pretrained=False)` has it)."""
        if self._pretrained_cfg is None:
            self._pretrained_cfg = default_pretrained_cfg(self._variant, self)
        return self._pretrained_cfg

    @pretrained_cfg.setter
    def pretrained_cfg(self, cfg: dict[str, Any]) -> None:
        self._pretrained_cfg = cfg

    @property
    def default_cfg(self) -> dict[str, Any]:
        """timm's older name for `pretrained_cfg`."""
        return self.pretrained_cfg

    @default_cfg.setter
    def default_cfg(self, cfg: dict[str, Any]) -> None:
        self._pretrained_cfg = cfg

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Parameters that take no weight decay besides norms and biases (which the optimizer finds by ndim)."""
        return {"pos_embed", "cls_token", "reg_token", "dist_token"} & {n for n, _ in self.named_parameters()}  # timm's

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """Parameter groups by depth, as timm's (layer-wise lr decay: timm.optim.create_optimizer_v2(...,
        layer_decay=0.75)): the embeddings first, then one group per block, the final norm with the last."""
        dist = "|dist_token" if self.head_dist is not None else ""
        stem = r"^cls_token|reg_token|pos_embed|patch_embed|norm_pre" + dist
        return dict(stem=stem,
                    blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute block activations in backward while training (memory for compute); outputs unchanged."""
        self.blocks.grad_checkpointing = enable

    @torch.jit.ignore
    def checkpoint_filter_fn(self, state: dict[str, torch.Tensor], report: Any) -> dict[str, torch.Tensor]:
        """Pretrained weights fitted to this model (positions resampled, input channels adapted); see
        vit/models/vision_weights.py. `vit.load_pretrained` calls it before its strict check."""
        return checkpoint_filter_fn(state, self, report)

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module | tuple[nn.Module, nn.Module]:
        """The head; a distilled model's two heads (head, head_dist), as timm's VisionTransformerDistilled."""
        return self.head if self.head_dist is None else (self.head, self.head_dist)

    @torch.jit.ignore
    def set_distilled_training(self, enable: bool = True) -> None:
        """A distilled model in training returns (logits, distillation logits) instead of their mean (timm)."""
        self.distilled_training = enable

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A new head for `num_classes` (0: none, forward returns pooled features) and optionally another pooling
        ('' returns every token). The norms stay where they are, as in timm; leaving 'map' drops the attention
        pool, and 'map' needs a model built with it."""
        if global_pool is not None:
            pooling = dataclasses.replace(self.pooling, global_pool=global_pool)
            pooling.check(self.has_class_token)
            if global_pool == "map" and self.attn_pool is None:
                raise ValueError("global_pool='map' needs attention-pooling weights; build the model with "
                                 "global_pool='map' instead of switching to it.")
            if self.head_dist is not None and global_pool not in ("token", ""):
                raise ValueError("a distilled model's heads read [CLS] and [DIST]; keep global_pool='token'.")
            if global_pool != "map":
                self.attn_pool = None
            self.pooling, self.global_pool = pooling, global_pool
        self.num_classes = num_classes
        ref = self.patch_embed.proj.weight
        new_head = lambda: (nn.Linear(self.embed_dim, num_classes, device=ref.device, dtype=ref.dtype)  # noqa: E731
                            if num_classes > 0 else nn.Identity())
        self.head = new_head()
        if self.head_dist is not None:
            self.head_dist = new_head()

    def set_fused_attn(self, enabled: bool) -> None:
        self.blocks.fused_attn = enabled

    @torch.jit.ignore
    def set_input_size(
        self, img_size: int | tuple[int, int] | None = None, patch_size: int | tuple[int, int] | None = None
    ) -> None:
        """Change the input resolution and/or patch size in place, as timm: positions are resampled (bicubic,
        [CLS] kept apart), patch projections are resized (FlexiViT's pseudo-inverse, timm's resample_patch_embed)."""
        prev_grid = self.patch_embed.grid_size
        self.patch_embed.set_input_size(img_size, patch_size)
        grid = self.patch_embed.grid_size
        for info in self.feature_info:
            info["reduction"] = max(self.patch_embed.patch_size)
        if grid == prev_grid:
            return
        if isinstance(self.pos_embed, nn.Parameter):
            pos = resample_abs_pos_embed(self.pos_embed.detach(), grid, prev_grid, self.num_pos_prefix)
            self.pos_embed = nn.Parameter(pos, requires_grad=self.pos_embed.requires_grad)
        elif self.pos_embed is not None:
            self.pos_embed = self._sincos(grid).to(self.pos_embed)

    def grid_size(self, img_size: tuple[int, int] | None = None) -> tuple[int, int]:
        """The patch grid (h, w) for an input of `img_size` (H, W), or for the configured size."""
        if img_size is None:
            return self.patch_embed.grid_size
        return self.patch_embed.dynamic_grid(*img_size)

    # --- forward --------------------------------------------------------------------------------------------

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> tokens (B, prefix + h*w, D): patches, prefix tokens prepended, positions added,
        then the pre-norm (CLIP; nothing elsewhere)."""
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
        if rope is not None and patch_keep is not None:
            raise ValueError("patch_keep removes patches whose rotary positions the model would still apply; "
                             "drop patch_keep for a model with rotary positions.")
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
            return self.attn_pool(x[:, self.num_prefix_tokens :])
        return pool_tokens(x, self.global_pool if pool_type is None else pool_type, self.num_prefix_tokens)

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
        x = self.head_drop(self.fc_norm(self.pool(x)))
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

    def set_sparse_attention(self, method: str | None, density: float | None = None, topk_blocks: int | None = None,
                             select: str | None = None, min_tokens: int | None = None) -> None:
        """Attend sparsely (vit.layers.sparse_attention) with other options than the model was built with, or
        densely (`None`); a spec string "METHOD[:DENSITY][:SELECT]" works too ("moba:0.25", "dsa:0.125:block",
        "none"). A model built without "dsa" has no indexer, so it may switch to "moba" only."""
        if method is not None and ":" in method or method in ("none", ""):
            if density is not None or topk_blocks is not None or select is not None:
                raise ValueError(f"pass either the spec {method!r} or keyword options, not both.")
            opts = parse_sparse_spec(method)
            method, density, select = opts["method"], opts["density"], opts["select"]
        self.blocks.set_sparse_attention(method, density=density, topk_blocks=topk_blocks, select=select,
                                         min_tokens=min_tokens)

    # --- token reduction ----------------------------------------------------------------------------------------

    def set_token_reduction(
        self,
        method: str | None,
        r: int | list[int] | None = None,
        keep_rate: float | None = None,
        layers: tuple[int, ...] | None = None,
    ) -> None:
        """Reduce tokens between attention and MLP (vit.layers.token_reduction), or stop (`None`):
        `set_token_reduction("merge", r=8)` (ToMe, off the shelf), `("topk", keep_rate=0.7, layers=(3, 6, 9))`
        (EViT, trained in), or a spec string such as "merge:8" or "topk:0.7@3,6,9". Weights are untouched."""
        if method is not None and ":" in method or method in ("none", ""):
            if r is not None or keep_rate is not None or layers is not None:
                raise ValueError(f"pass either the spec {method!r} or keyword options, not both.")
            opts = parse_token_reduction(method)
            method, r, keep_rate, layers = (opts["method"], opts.get("r"), opts.get("keep_rate"),
                                            opts.get("layers"))
        self.blocks.set_token_reduction(
            build_token_reduction(len(self.blocks), self.num_prefix_tokens, method, r, keep_rate, layers))


# --- create_model's options ----------------------------------------------------------------------------

# create_model's vocabulary is timm's keywords: the constructor's flat options, and the fields of its options
# objects under their own (timm's) names, e.g. reg_tokens=4 -> prefix=PrefixTokens(reg_tokens=4)
OBJECTS = {"prefix": PrefixTokens, "pooling": Pooling}
_PARAMS = {k: p for k, p in inspect.signature(VisionTransformer.__init__).parameters.items() if k != "self"}
_FIELDS = {f.name: (key, f) for key, cls in OBJECTS.items() for f in dataclasses.fields(cls)}
OPTIONS = (set(_PARAMS) - set(OBJECTS)) | set(_FIELDS)  # what a variant may override


def constructor_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """timm's keywords (`class_token`, `reg_tokens`, `global_pool`, ...) -> VisionTransformer's arguments, each
    options object built (and so validated) once from its fields."""
    flat = {k: v for k, v in options.items() if k not in _FIELDS}
    for key, cls in OBJECTS.items():
        flat[key] = cls(**{f.name: options[f.name] for f in dataclasses.fields(cls) if f.name in options})
    return flat


def option_types() -> dict[str, Any]:
    """The type of every create_model option (for checking a config.json's model_args before building)."""
    hints = typing.get_type_hints(VisionTransformer.__init__)
    for key, cls in OBJECTS.items():
        hints.pop(key, None)
        hints.update(typing.get_type_hints(cls))
    return hints


def architecture_defaults(name: str) -> dict[str, Any]:
    """Every create_model option at its value for the variant `name` (the defaults, then the variant's own); an
    unknown name gets the defaults. What a checkpoint's config.json leaves out."""
    defaults = {k: p.default for k, p in _PARAMS.items() if k not in OBJECTS}
    defaults.update({name: f.default for name, (_, f) in _FIELDS.items()})
    return {**defaults, **VARIANTS.get(name, {})}


def default_pretrained_cfg(name: str | None, model: VisionTransformer) -> dict[str, Any]:
    """timm's pretrained config for `name` (its default tag) from timm's registry; for a model built without a
    name, one describing the model itself (timm's ViT defaults: bicubic, crop 0.9, mean = std = 0.5)."""
    if name is not None:
        from timm.models import resolve_pretrained_cfg  # imported on first use only: importing timm takes seconds

        return resolve_pretrained_cfg(name).to_dict()
    return dict(input_size=(model.in_chans, *model.patch_embed.img_size), fixed_input_size=not model.dynamic_img_size,
                interpolation="bicubic", crop_pct=0.9, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5),
                num_classes=model.num_classes, pool_size=None, first_conv="patch_embed.proj", classifier="head")
