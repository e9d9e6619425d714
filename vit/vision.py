"""The Vision Transformer (Dosovitskiy et al., 2021, "An Image is Worth 16x16 Words", eqs. 1-4).

    z0 = [x_cls; x_p^1 E; ...; x_p^N E] + E_pos           patches -> tokens, [CLS] first     (eq. 1)
    z_l = Encoder(z_{l-1})                                the shared pre-norm stack          (eqs. 2-3)
    y  = Head(Norm(z_L^0))                                [CLS] (or mean of patch tokens)    (eq. 4)

Parameter names and shapes match timm's `VisionTransformer`, so `load_state_dict(timm_model.state_dict())`
works with strict=True and timm serves as the numerical oracle. API: `forward_features`, `forward_head`,
`forward(x, return_attention=False)`.
"""

from __future__ import annotations

import inspect
from typing import Literal

import torch
from torch import nn

from .encoder import Encoder
from .layers import (
    PatchEmbed,
    build_token_reduction,
    get_norm_layer,
    parse_token_reduction,
    resample_abs_pos_embed,
    sincos_2d,
    to_2tuple,
)
from .pretrained import load_pretrained

__all__ = ["VisionTransformer", "create_model", "list_models", "VARIANTS"]


class VisionTransformer(nn.Module):
    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: Literal["token", "avg"] = "token",
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
        mlp_layer: str = "gelu",
        norm_first: bool = True,
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        fused_attn: bool = True,
    ) -> None:
        super().__init__()
        if global_pool not in ("token", "avg"):
            raise ValueError(f"unknown global_pool {global_pool!r}; choose 'token' or 'avg'.")
        if global_pool == "token" and not class_token:
            raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg' without it.")
        if pos_embed not in ("learn", "sincos"):
            raise ValueError(f"unknown pos_embed {pos_embed!r}; choose 'learn' or 'sincos'.")
        norm = get_norm_layer(norm_layer)
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_features = self.embed_dim = embed_dim
        self.num_prefix_tokens = 1 if class_token else 0
        self.dynamic_img_size = dynamic_img_size
        self.pos_embed_type = pos_embed

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
            fused_attn=fused_attn,
        )
        # timm: mean pooling normalizes the pooled vector (fc_norm) instead of every token (norm). A post-norm
        # stack already ends in a norm, so it gets none here.
        use_fc_norm = global_pool == "avg"
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

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Parameters that take no weight decay besides norms and biases (which the optimizer finds by ndim)."""
        return {"pos_embed", "cls_token"}

    def reset_classifier(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    def set_fused_attn(self, enabled: bool) -> None:
        self.blocks.fused_attn = enabled

    def grid_size(self, img_size: tuple[int, int] | None = None) -> tuple[int, int]:
        """The patch grid (h, w) for an input of `img_size` (H, W), or for the configured size."""
        if img_size is None:
            return self.patch_embed.grid_size
        return self.patch_embed.dynamic_grid(*img_size)

    # --- forward --------------------------------------------------------------------------------------------

    def _pos_embed(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """x: (B, h*w, D) patch tokens -> (B, prefix + h*w, D) with [CLS] prepended and positions added."""
        pos = self.pos_embed
        if grid != self.patch_embed.grid_size:
            if not self.dynamic_img_size:
                H, W = (g * p for g, p in zip(grid, self.patch_embed.patch_size))
                h, w = self.patch_embed.img_size
                raise ValueError(
                    f"input size {H}x{W} differs from the model's {h}x{w}; resize the input, or build the model "
                    "with dynamic_img_size=True (positions are then resampled on the fly)."
                )
            if self.pos_embed_type == "learn":
                pos = resample_abs_pos_embed(pos, grid, self.patch_embed.grid_size, self.num_prefix_tokens)
            else:
                pos = self._sincos(grid).to(x)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.pos_drop(x + pos)

    def encode(
        self,
        x: torch.Tensor,
        patch_keep: torch.Tensor | None = None,
        return_attention: bool = False,
        last_queries: int | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Images (B, C, H, W) -> normalized tokens (B, prefix + N, D) and the per-block attention maps.

        `patch_keep` (B, K) lists the patch indices (row-major) to keep after positions are added; the others
        are removed from the sequence (token deletion: a ViT takes a shorter sequence natively).
        `last_queries=q` runs the last block for the first q tokens only: (B, q, D).
        """
        grid = self.grid_size(x.shape[-2:])
        x = self._pos_embed(self.patch_embed(x), grid)  # (B, prefix + h*w, D)
        if patch_keep is not None:
            p = self.num_prefix_tokens
            idx = patch_keep[..., None].expand(-1, -1, x.shape[-1])  # (B, K, D)
            x = torch.cat([x[:, :p], x[:, p:].gather(1, idx)], dim=1)  # (B, prefix + K, D)
        x, attentions = self.blocks(x, return_attention=return_attention, last_queries=last_queries)
        return self.norm(x), attentions

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, prefix + N, D)."""
        return self.encode(x)[0]

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """(B, prefix + N, D) -> pooled (B, D) if pre_logits, else logits (B, num_classes)."""
        x = x[:, self.num_prefix_tokens :].mean(dim=1) if self.global_pool == "avg" else x[:, 0]
        x = self.head_drop(self.fc_norm(x))
        return x if pre_logits else self.head(x)

    def forward(
        self, x: torch.Tensor, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits (B, num_classes); with return_attention, also a list of (B, H, N, N) maps, one per block.

        A [CLS]-pooled pre-norm classifier reads one token of the last block, so that block is computed for
        [CLS] only (its attention still looks at every token): same logits, ~7% fewer FLOPs at 12 blocks."""
        prune = (self.prune_last_block and not return_attention and self.global_pool == "token"
                 and self.blocks[-1].norm_first)
        feats, attentions = self.encode(x, return_attention=return_attention, last_queries=1 if prune else None)
        logits = self.forward_head(feats)
        return (logits, attentions) if return_attention else logits

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
        modules = build_token_reduction(len(self.blocks), self.num_prefix_tokens, method, r, keep_rate, layers)
        for blk, m in zip(self.blocks, modules):
            blk.token_reduction = m


# --- variants and the factory -------------------------------------------------------------------------------

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
_OPTIONS = set(inspect.signature(VisionTransformer.__init__).parameters) - {"self"}


def list_models() -> list[str]:
    return sorted(VARIANTS)


def create_model(
    name: str, pretrained: str | None = None, token_reduction: str | None = None, **overrides
) -> VisionTransformer:
    """Build a named variant with optional overrides, e.g. `create_model('vit_small_patch16_224',
    img_size=64, num_classes=10)`. `pretrained` is a path to a timm checkpoint file, loaded with
    `vit.load_pretrained` (positions resampled and the head replaced as needed). `token_reduction` is a spec
    such as "merge:8" or "topk:0.7@3,6,9" (see `VisionTransformer.set_token_reduction`)."""
    if name not in VARIANTS:
        close = [m for m in VARIANTS if name.split("_patch")[0] in m] or list_models()
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(close)}.")
    unknown = sorted(set(overrides) - _OPTIONS)
    if unknown:
        raise TypeError(
            f"unknown model option(s) {', '.join(map(repr, unknown))} for {name}; "
            f"valid options are: {', '.join(sorted(_OPTIONS))}."
        )
    kwargs = {**VARIANTS[name], **overrides}
    if isinstance(kwargs.get("img_size"), list):
        kwargs["img_size"] = to_2tuple(kwargs["img_size"])
    model = VisionTransformer(**kwargs)
    if pretrained:
        load_pretrained(model, pretrained)
    if token_reduction is not None:
        model.set_token_reduction(token_reduction)
    return model

