"""vit: a Vision Transformer toolkit built on one shared Transformer encoder.

Public API:
    create_model, list_models, VisionTransformer   the image model (timm-compatible names and weights)
    TextEncoder                                    the same encoder on token ids
    create_clip_model, CLIP, load_clip_tokenizer   CLIP / SigLIP image + text towers by name (open_clip's or
                                                   transformers' layout), their tokenizers
    create_text_model, load_tokenizer, Tokenizer   BERT / RoBERTa / DistilBERT / CLIP-text weights and their
                                                   tokenizers by name (hf-hub:org/name, local-dir:/folder);
                                                   num_classes=N: a TextClassifier (transformers' heads)
    save_text_model                                a TextClassifier as a folder transformers loads too
    save_clip_model                                a CLIP as an open_clip repository (we and open_clip load it)
    text_encoder_from_config, ...classifier...     the same architectures with random weights
    Encoder, Block, Attention                      the shared building blocks
    load_pretrained                                timm / HF-timm weights, resampled and adapted
    attention_rollout, gradient_rollout, ...       where the model looks (vit.explain.rollout)

The names load on first use (PEP 562 `__getattr__`, as Hugging Face transformers does), so `import vit.config`
does not import torch: a script's `--help` answers at once instead of after ~7 s of imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the submodule that defines it
_EXPORTS = {
    "Block": "models.encoder",
    "Encoder": "models.encoder",
    "Attention": "layers",
    "resample_abs_pos_embed": "layers",
    "load_pretrained": "hub.weights",
    "read_state_dict": "hub.weights",
    "attention_maps": "explain.rollout",
    "attention_rollout": "explain.rollout",
    "gradient_rollout": "explain.rollout",
    "raw_attention": "explain.rollout",
    "to_grid": "explain.rollout",
    "TextEncoder": "models.text_encoder",
    "TextEncoderOutput": "models.text_encoder",
    "Tokenizer": "hub.tokenizer",
    "load_tokenizer": "hub.tokenizer",
    "create_text_model": "models.text_build",
    "CLIP": "models.clip",
    "create_clip_model": "models.clip",
    "load_clip_tokenizer": "hub.clip_tokenizer",
    "text_encoder_from_config": "models.text_build",
    "text_classifier_from_config": "models.text_build",
    "TextClassifier": "models.text_classifier",
    "save_text_model": "models.text_save",
    "save_clip_model": "models.clip_save",
    "VARIANTS": "models.variants",
    "VisionTransformer": "models.vision_transformer",
    "create_model": "models.build",
    "list_models": "models.build",
}

__all__ = [
    "Attention",
    "CLIP",
    "Block",
    "Encoder",
    "TextClassifier",
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
    "create_clip_model",
    "create_model",
    "create_text_model",
    "list_models",
    "load_clip_tokenizer",
    "load_tokenizer",
    "load_pretrained",
    "read_state_dict",
    "resample_abs_pos_embed",
    "save_clip_model",
    "save_text_model",
    "text_classifier_from_config",
    "text_encoder_from_config",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    else:  # a submodule not imported yet: vit.explain.rollout, vit.layers, ...
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
    from .explain.rollout import attention_maps, attention_rollout, gradient_rollout, raw_attention, to_grid
    from .hub.clip_tokenizer import load_clip_tokenizer
    from .hub.tokenizer import Tokenizer, load_tokenizer
    from .hub.weights import load_pretrained, read_state_dict
    from .layers import Attention, resample_abs_pos_embed
    from .models.build import create_model, list_models
    from .models.clip import CLIP, create_clip_model
    from .models.clip_save import save_clip_model
    from .models.encoder import Block, Encoder
    from .models.text_build import create_text_model, text_classifier_from_config, text_encoder_from_config
    from .models.text_classifier import TextClassifier
    from .models.text_encoder import TextEncoder, TextEncoderOutput
    from .models.text_save import save_text_model
    from .models.variants import VARIANTS
    from .models.vision_transformer import VisionTransformer
