"""vit: a Vision Transformer toolkit built on one shared Transformer encoder.

Public API:
    create_model, list_models, VisionTransformer   the image model (timm-compatible names and weights)
    TextEncoder                                    the same encoder on token ids
    create_text_model, load_tokenizer, Tokenizer   BERT / RoBERTa / DistilBERT / CLIP-text weights and their
                                                   tokenizers by name (hf-hub:org/name, local-dir:/folder);
    text_encoder_from_config                       the same architectures with random weights
    Encoder, Block, Attention                      the shared building blocks
    load_pretrained                                timm / HF-timm weights, resampled and adapted
    attention_rollout, gradient_rollout, ...       where the model looks (vit.rollout)

The names load on first use (PEP 562 `__getattr__`, as Hugging Face transformers does), so `import vit.config`
does not import torch: a script's `--help` answers at once instead of after ~7 s of imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the submodule that defines it
_EXPORTS = {
    "Block": "encoder",
    "Encoder": "encoder",
    "Attention": "layers",
    "resample_abs_pos_embed": "layers",
    "load_pretrained": "pretrained",
    "read_state_dict": "pretrained",
    "attention_maps": "rollout",
    "attention_rollout": "rollout",
    "gradient_rollout": "rollout",
    "raw_attention": "rollout",
    "to_grid": "rollout",
    "TextEncoder": "text",
    "TextEncoderOutput": "text",
    "Tokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
    "create_text_model": "models.text_build",
    "text_encoder_from_config": "models.text_build",
    "VARIANTS": "vision",
    "VisionTransformer": "vision",
    "create_model": "vision",
    "list_models": "vision",
}

__all__ = [
    "Attention",
    "Block",
    "Encoder",
    "TextEncoder",
    "TextEncoderOutput",
    "Tokenizer",
    "attention_maps",
    "attention_rollout",
    "gradient_rollout",
    "raw_attention",
    "to_grid",
    "VARIANTS",
    "VisionTransformer",
    "create_model",
    "create_text_model",
    "list_models",
    "load_tokenizer",
    "load_pretrained",
    "read_state_dict",
    "resample_abs_pos_embed",
    "text_encoder_from_config",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    else:  # a submodule not imported yet: vit.rollout, vit.layers, ...
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # static checkers and IDEs see the eager imports
    from .encoder import Block, Encoder
    from .layers import Attention, resample_abs_pos_embed
    from .models.text_build import create_text_model, text_encoder_from_config
    from .pretrained import load_pretrained, read_state_dict
    from .rollout import attention_maps, attention_rollout, gradient_rollout, raw_attention, to_grid
    from .text import TextEncoder, TextEncoderOutput
    from .tokenizer import Tokenizer, load_tokenizer
    from .vision import VARIANTS, VisionTransformer, create_model, list_models
