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

import inspect
from typing import Any, Literal

import torch
import torch.fx
from torch import nn

from ..layers import (
    PatchEmbed,
    build_token_reduction,
    get_norm_layer,
    parse_token_reduction,
    resample_abs_pos_embed,
    sincos_2d,
    sparse_kwargs,
)
from ..layers.sparse_attention import check_sparse_options, parse_sparse_spec
from .encoder import Encoder
from .features import FeatureIntermediates
from .vision_weights import checkpoint_filter_fn

__all__ = ["VisionTransformer", "VARIANTS", "OPTIONS", "architecture_defaults", "default_pretrained_cfg"]

GLOBAL_POOLS = ("token", "avg", "max", "avgmax", "")  # timm's, less attention pooling ('map')


def _check_global_pool(global_pool: str, class_token: bool) -> None:
    if global_pool not in GLOBAL_POOLS:
        raise ValueError(f"unknown global_pool {global_pool!r}; choose 'token', 'avg', 'max', 'avgmax' or '' (none).")
    if global_pool == "token" and not class_token:
        raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg' without it.")


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
    heads transform the (B, 1 + h*w, D) sequence, and the head reads the [CLS] token (`global_pool="token"`)
    or the mean of the patch tokens (`"avg"`). Options and parameter names are timm's (plus `norm_first`,
    `norm_layer`, `norm_eps`, `mlp_layer`, `pos_embed`, and `sparse_attention="dsa" | "moba"` with its
    `sparse_*` options, see vit.layers.sparse_attention); build named variants with `vit.create_model`.
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
        global_pool: Literal["token", "avg", "max", "avgmax", ""] = "token",
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        class_token: bool = True,
        pos_embed: Literal["learn", "sincos"] = "learn",
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
        sparse_attention: str | None = None,
        sparse_block_size: int = 128,
        sparse_topk_blocks: int | None = None,
        sparse_density: float | None = None,
        sparse_select: str | None = None,
        sparse_own_block: bool | None = None,
        sparse_sink_block: bool | None = None,
        sparse_min_tokens: int | None = None,
    ) -> None:
        super().__init__()
        _check_global_pool(global_pool, class_token)
        if pos_embed not in ("learn", "sincos"):
            raise ValueError(f"unknown pos_embed {pos_embed!r}; choose 'learn' or 'sincos'.")
        norm = get_norm_layer(norm_layer, norm_eps)
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.global_pool = global_pool
        # timm's names for the token width: features, pre-logits and embedding are all D in a plain ViT
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_prefix_tokens = 1 if class_token else 0
        self.has_class_token = class_token
        self.dynamic_img_size = dynamic_img_size
        self.pos_embed_type = pos_embed
        self.norm_first = norm_first
        self._variant: str | None = None  # the name create_model built, for pretrained_cfg
        self._pretrained_cfg: dict[str, Any] | None = None

        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        if pos_embed == "learn":
            self.pos_embed = nn.Parameter(torch.zeros(1, self.num_prefix_tokens + num_patches, embed_dim))
        else:  # fixed: a buffer, not saved, rebuilt for any grid; the [CLS] slot gets a zero vector
            self.register_buffer("pos_embed", self._sincos(self.patch_embed.grid_size), persistent=False)
        self.pos_drop = nn.Dropout(pos_drop_rate)

        self.blocks = Encoder(
            depth, embed_dim, num_heads, mlp_ratio, qkv_bias, drop_rate, attn_drop_rate, drop_path_rate,
            init_values=init_values, norm_layer=norm, mlp_layer=mlp_layer, norm_first=norm_first,
            fused_attn=fused_attn, sparse=sparse_kwargs(
                sparse_attention, sparse_block_size, sparse_topk_blocks, sparse_density, sparse_select,
                sparse_own_block, sparse_sink_block, sparse_min_tokens),
        )
        # one feature level per block, all at the patch stride (timm's feature_info)
        self.feature_info = [
            dict(module=f"blocks.{i}", num_chs=embed_dim, reduction=max(self.patch_embed.patch_size))
            for i in range(depth)
        ]
        # timm: mean/max pooling normalizes the pooled vector (fc_norm) instead of every token (norm). A post-norm
        # stack already ends in a norm, so it gets none here.
        use_fc_norm = global_pool in ("avg", "max", "avgmax")
        self.norm = norm(embed_dim) if norm_first and not use_fc_norm else nn.Identity()
        self.fc_norm = norm(embed_dim) if norm_first and use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        # forward() of a [CLS]-pooled model runs its last block for [CLS] only; False runs every token (e.g. for
        # hooks that inspect the last block's outputs)
        self.prune_last_block = True
        self.init_weights()

    # --- construction helpers -------------------------------------------------------------------------------

    def _sincos(self, grid: tuple[int, int]) -> torch.Tensor:
        table = sincos_2d(grid, self.embed_dim)  # (h*w, D)
        prefix = table.new_zeros(self.num_prefix_tokens, self.embed_dim)
        return torch.cat([prefix, table])[None]  # (1, prefix + h*w, D)

    def init_weights(self) -> None:
        """timm's default ViT init: truncated normal (std 0.02) for linears and positions, tiny [CLS]."""
        if isinstance(self.pos_embed, nn.Parameter):
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
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
        return {"pos_embed", "cls_token"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """Parameter groups by depth, as timm's (layer-wise lr decay: timm.optim.create_optimizer_v2(...,
        layer_decay=0.75)): the embeddings first, then one group per block, the final norm with the last."""
        return dict(stem=r"^cls_token|reg_token|pos_embed|patch_embed|norm_pre",
                    blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute block activations in backward while training (memory for compute); outputs unchanged."""
        self.blocks.grad_checkpointing = enable

    @torch.jit.ignore
    def set_freeze(self, enable: bool = True) -> None:
        """Train the head only (a linear probe trained end to end): every other parameter stops requiring a
        gradient, so timm's optimizer factory leaves it out. The head's own parameters keep theirs."""
        head = {id(p) for p in self.get_classifier().parameters()}
        for p in self.parameters():
            p.requires_grad_(not enable or id(p) in head)

    @torch.jit.ignore
    def checkpoint_filter_fn(self, state: dict[str, torch.Tensor], report: Any) -> dict[str, torch.Tensor]:
        """Pretrained weights fitted to this model (positions resampled, input channels adapted); see
        vit/models/vision_weights.py. `vit.load_pretrained` calls it before its strict check."""
        return checkpoint_filter_fn(state, self, report)

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A new head for `num_classes` (0: none, forward returns pooled features) and optionally another pooling
        ('' returns every token). The norms stay where they are, as in timm."""
        if global_pool is not None:
            _check_global_pool(global_pool, self.cls_token is not None)
            self.global_pool = global_pool
        self.num_classes = num_classes
        ref = self.patch_embed.proj.weight
        self.head = (nn.Linear(self.embed_dim, num_classes, device=ref.device, dtype=ref.dtype)
                     if num_classes > 0 else nn.Identity())

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
            pos = resample_abs_pos_embed(self.pos_embed.detach(), grid, prev_grid, self.num_prefix_tokens)
            self.pos_embed = nn.Parameter(pos, requires_grad=self.pos_embed.requires_grad)
        else:
            self.pos_embed = self._sincos(grid).to(self.pos_embed)

    def grid_size(self, img_size: tuple[int, int] | None = None) -> tuple[int, int]:
        """The patch grid (h, w) for an input of `img_size` (H, W), or for the configured size."""
        if img_size is None:
            return self.patch_embed.grid_size
        return self.patch_embed.dynamic_grid(*img_size)

    # --- forward --------------------------------------------------------------------------------------------

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> tokens (B, prefix + h*w, D): patches, [CLS] prepended, positions added."""
        if self.dynamic_img_size:
            grid = self.patch_embed.dynamic_grid(x.shape[-2], x.shape[-1])
        else:
            check_img_size(x, self.patch_embed.img_size)
            grid = self.patch_embed.grid_size
        return self._pos_embed(self.patch_embed(x), grid)

    def _pos_embed(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """x: (B, h*w, D) patch tokens -> (B, prefix + h*w, D) with [CLS] prepended and positions added."""
        pos = self.pos_embed
        if self.dynamic_img_size:
            pos = self._resized_pos_embed(grid).to(x.dtype)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.pos_drop(x + pos)

    @torch.jit.ignore  # runs as Python inside a scripted model (so a scripted model cannot be saved with it)
    def _resized_pos_embed(self, grid: tuple[int, int]) -> torch.Tensor:
        """(1, prefix + h*w, D) positions for another grid: learned ones resampled, sine-cosine ones rebuilt."""
        if grid == self.patch_embed.grid_size:
            return self.pos_embed
        if self.pos_embed_type == "learn":
            return resample_abs_pos_embed(self.pos_embed, grid, self.patch_embed.grid_size, self.num_prefix_tokens)
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
        x = self._embed(x)  # (B, prefix + h*w, D)
        if patch_keep is not None:
            p = self.num_prefix_tokens
            idx = patch_keep[..., None].expand(-1, -1, x.shape[-1])  # (B, K, D)
            x = torch.cat([x[:, :p], x[:, p:].gather(1, idx)], dim=1)  # (B, prefix + K, D)
        x, attentions = self.blocks(x, attn_mask, is_causal, return_attention, last_queries)
        return self.norm(x), attentions

    def forward_features(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> torch.Tensor:
        """(B, C, H, W) -> (B, prefix + N, D), after the final norm. attn_mask: any form `expand_mask` takes."""
        x, _ = self.blocks(self._embed(x), attn_mask, is_causal)
        return self.norm(x)

    def pool(self, x: torch.Tensor, pool_type: str | None = None) -> torch.Tensor:
        """(B, prefix + N, D) -> (B, D): [CLS] ('token'), mean/max/both of the patch tokens; '' keeps all."""
        pool_type = self.global_pool if pool_type is None else pool_type
        if pool_type == "token":
            return x[:, 0]
        if pool_type == "":
            return x
        x = x[:, self.num_prefix_tokens :]
        if pool_type == "avg":
            return x.mean(dim=1)
        if pool_type == "max":
            return x.amax(dim=1)
        return 0.5 * (x.amax(dim=1) + x.mean(dim=1))  # 'avgmax'

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """(B, prefix + N, D) -> pooled (B, D) if pre_logits, else logits (B, num_classes)."""
        x = self.head_drop(self.fc_norm(self.pool(x)))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        """Logits (B, num_classes) (pooled features if num_classes=0; every token if global_pool='').

        A [CLS]-pooled pre-norm classifier reads one token of the last block, so that block is computed for
        [CLS] only (its attention still looks at every token): same logits, ~7% fewer FLOPs at 12 blocks."""
        prune = self.prune_last_block and self.global_pool == "token" and self.norm_first and (
            torch.jit.is_scripting() or not (self.training and self._last_block_learns_an_indexer()))
        x, _ = self.blocks(self._embed(x), attn_mask, is_causal, False, 1 if prune else None)
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
        check_sparse_options(method, 128, topk_blocks, density, select)
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


# --- variants --------------------------------------------------------------------------------------------

# timm's names and architectures (Dosovitskiy et al., 2021, table 1; Touvron et al., 2021 for Ti and S).
VARIANTS: dict[str, dict] = {
    "vit_tiny_patch16_224": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3),
    "vit_small_patch16_224": dict(patch_size=16, embed_dim=384, depth=12, num_heads=6),
    "vit_base_patch16_224": dict(patch_size=16, embed_dim=768, depth=12, num_heads=12),
    "vit_large_patch16_224": dict(patch_size=16, embed_dim=1024, depth=24, num_heads=16),
    "vit_base_patch32_224": dict(patch_size=32, embed_dim=768, depth=12, num_heads=12),
    "vit_small_patch16_384": dict(img_size=384, patch_size=16, embed_dim=384, depth=12, num_heads=6),
    "vit_base_patch16_384": dict(img_size=384, patch_size=16, embed_dim=768, depth=12, num_heads=12),
}
OPTIONS = set(inspect.signature(VisionTransformer.__init__).parameters) - {"self"}  # what a variant may override


def architecture_defaults(name: str) -> dict[str, Any]:
    """Every `VisionTransformer` option at its value for the variant `name` (the constructor's defaults, then the
    variant's own); an unknown name gets the constructor's defaults. What a checkpoint's config.json leaves out."""
    defaults = {k: p.default for k, p in inspect.signature(VisionTransformer.__init__).parameters.items()
                if k != "self"}
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
