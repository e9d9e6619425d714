"""vit: a Vision Transformer toolkit built on one shared Transformer encoder.

Public API:
    create_model, list_models, VisionTransformer   the image model (timm-compatible names and weights)
    TextEncoder                                    the same encoder on token ids
    Encoder, Block, Attention                      the shared building blocks
    load_pretrained                                timm / HF-timm weights, resampled and adapted
    attention_rollout, gradient_rollout, ...       where the model looks (vit.rollout)
"""

from .encoder import Block, Encoder
from .layers import Attention, resample_abs_pos_embed
from .pretrained import load_pretrained, read_state_dict
from .rollout import attention_maps, attention_rollout, gradient_rollout, raw_attention, to_grid
from .text import TextEncoder, TextEncoderOutput
from .vision import VARIANTS, VisionTransformer, create_model, list_models

__all__ = [
    "Attention",
    "Block",
    "Encoder",
    "TextEncoder",
    "TextEncoderOutput",
    "attention_maps",
    "attention_rollout",
    "gradient_rollout",
    "raw_attention",
    "to_grid",
    "VARIANTS",
    "VisionTransformer",
    "create_model",
    "list_models",
    "load_pretrained",
    "read_state_dict",
    "resample_abs_pos_embed",
]
