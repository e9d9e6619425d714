"""timm's model API around the Vision Transformer (vit/models/vision_transformer.py): what optimizers, feature
extractors and training loops read (`pretrained_cfg`, `no_weight_decay`, `group_matcher`, `reset_classifier`, ...)
and the switches that change how a built model runs (`set_input_size`, `set_token_reduction`,
`set_sparse_attention`: timm-style keywords or a spec string). A mixin: the model's state lives in VisionTransformer."""

import dataclasses
from typing import Any

import torch
from torch import nn

from ..layers import build_token_reduction, check_combination, parse_token_reduction, resample_abs_pos_embed
from ..layers.sparse_attention import parse_sparse_spec
from .vision_weights import checkpoint_filter_fn

__all__ = ["ModelApi", "default_pretrained_cfg"]


class ModelApi:
    """Methods VisionTransformer takes from here; each reads the model's attributes (`blocks`, `head`, `pooling`,
    `patch_embed`, ...)."""

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
        names = {"pos_embed", "cls_token", "reg_token", "dist_token", "rope.freqs"}  # timm's (RoPE-Mixed's too)
        return names & {n for n, _ in self.named_parameters()}

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
        ref = next(self.parameters())  # the new head's device and dtype
        new_head = lambda: (nn.Linear(self.embed_dim, num_classes, device=ref.device, dtype=ref.dtype)  # noqa: E731
                            if num_classes > 0 else nn.Identity())
        self.head = new_head()
        if self.head_dist is not None:
            self.head_dist = new_head()

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
            info["reduction"] = self.patch_embed.reduction
        if grid == prev_grid:
            return
        for m in self.rel_pos_modules():  # BEiT's tables resampled, the MLPs' offsets recomputed (as timm)
            m.set_grid(grid)
        if isinstance(self.pos_embed, nn.Parameter):
            pos = resample_abs_pos_embed(self.pos_embed.detach(), grid, prev_grid, self.num_pos_prefix)
            self.pos_embed = nn.Parameter(pos, requires_grad=self.pos_embed.requires_grad)
        elif self.pos_embed is not None:
            self.pos_embed = self._sincos(grid).to(self.pos_embed)

    def set_fused_attn(self, enabled: bool) -> None:
        self.blocks.fused_attn = enabled

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
        check_combination(token_reduction=method not in (None, "none", ""),
                          rope=getattr(self, "rope", None) is not None, **self.blocks.features())
        self.blocks.set_token_reduction(
            build_token_reduction(len(self.blocks), self.num_prefix_tokens, method, r, keep_rate, layers))


def default_pretrained_cfg(name: str | None, model: nn.Module) -> dict[str, Any]:
    """timm's pretrained config for `name` (its default tag) from timm's registry; for a model built without a
    name, one describing the model itself (timm's ViT defaults: bicubic, crop 0.9, mean = std = 0.5)."""
    if name is not None:
        from timm.models import resolve_pretrained_cfg  # imported on first use only: importing timm takes seconds

        return resolve_pretrained_cfg(name).to_dict()
    return dict(input_size=(model.in_chans, *model.patch_embed.img_size), fixed_input_size=not model.dynamic_img_size,
                interpolation="bicubic", crop_pct=0.9, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5),
                num_classes=model.num_classes, pool_size=None, first_conv="patch_embed.proj", classifier="head")
