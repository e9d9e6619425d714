"""train.py's CLIP for `data.dataset: captions`: the config's contrastive section to a model, from scratch (the image
tower model.* describes, a text tower of the contrastive.text_* sizes on the data's tokenizer) or from the weights
contrastive.pretrained names (vit.create_clip_model)."""

from __future__ import annotations

import math

from ..config import Config, ConfigError
from .build import build_model
from .clip import CLIP, create_clip_model, new_clip_model

__all__ = ["build_clip_model", "initial_logits"]


def initial_logits(loss: str, logit_scale: float | None, logit_bias: float | None) -> tuple[float, float | None]:
    """(log scale, bias or None): as set, else CLIP's log(1 / 0.07) and no bias, SigLIP's log(10) and -10."""
    if loss == "clip":
        return (math.log(1 / 0.07) if logit_scale is None else logit_scale), None
    return (math.log(10) if logit_scale is None else logit_scale), (-10.0 if logit_bias is None else logit_bias)


def build_clip_model(cfg: Config, tokenizer) -> CLIP:
    """The CLIP model a contrastive run trains, in training mode. `tokenizer`: the one the captions were tokenised
    with (vit.data.captions), which a model from scratch is sized for and a pretrained one must share."""
    c = cfg.contrastive
    if c.pretrained:
        model = create_clip_model(c.pretrained)
        own = "clip" if model.logit_bias is None else "siglip"
        if own != c.loss:
            raise ConfigError(f"contrastive.pretrained {c.pretrained} is a {own} model (it has "
                              f"{'no' if own == 'clip' else 'a'} logit_bias); set contrastive.loss={own}.")
        return model.train()
    visual = build_model(cfg, c.embed_dim)
    scale, bias = initial_logits(c.loss, c.logit_scale, c.logit_bias)
    return new_clip_model(visual, tokenizer, c.embed_dim, c.text_width, c.text_depth, c.text_heads, scale,
                          bias).train()
