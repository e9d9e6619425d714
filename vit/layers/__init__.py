"""Building blocks of the shared Transformer encoder, one concept per module."""

from .attention import Attention, expand_mask
from .drop import DropPath, LayerScale
from .mlp import Mlp, SwiGLU
from .norm import get_norm_layer
from .patch_embed import PatchEmbed, to_2tuple
from .pos_embed import resample_abs_pos_embed, sincos_1d, sincos_2d

__all__ = [
    "Attention",
    "DropPath",
    "LayerScale",
    "Mlp",
    "PatchEmbed",
    "SwiGLU",
    "expand_mask",
    "get_norm_layer",
    "resample_abs_pos_embed",
    "sincos_1d",
    "sincos_2d",
    "to_2tuple",
]
