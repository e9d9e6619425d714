"""create_model's vocabulary: timm's keywords (the VisionTransformer constructor's flat options, and the fields of
its options objects under their own names), their types, their defaults per architecture, and the constructor
arguments they become. The options that are mappings (`rope=dict(kind="dinov3")`, `stem`, `rel_pos`, `naflex`,
`sparse_attention`) are made by vit.config's one convention, `options_from`, so an unknown or mistyped key is one
sentence naming it whichever way the model is asked for (YAML, a config.json, Python)."""

import dataclasses
import inspect
import typing
from typing import Any

from ..config import AttentionOptions, options_from
from ..layers import BlockParts, Pooling, PrefixTokens
from .naflex_vit import NaFlexVit
from .sam_vit import SamViT
from .variants import VARIANTS
from .vision_transformer import VisionTransformer

__all__ = ["MAPPINGS", "OBJECTS", "OPTIONS", "PYTHON_ONLY", "architecture_defaults", "constructor_kwargs",
           "model_class", "option_types"]

# create_model's vocabulary is timm's keywords: the constructor's flat options, and the fields of its options
# objects under their own (timm's) names, e.g. reg_tokens=4 -> prefix=PrefixTokens(reg_tokens=4); an object may
# also come whole (attention=AttentionOptions(...), or one per block: attention=[..., ...])
OBJECTS = {"prefix": PrefixTokens, "pooling": Pooling, "parts": BlockParts, "attention": AttentionOptions}
# SamViT first: a keyword it shares with VisionTransformer keeps VisionTransformer's default (SAM's entries set
# theirs)
_PARAMS = {k: p for cls in (SamViT, VisionTransformer, NaFlexVit)
           for k, p in inspect.signature(cls.__init__).parameters.items()
           if k not in ("self", "args", "kwargs", "unused")}
_FIELDS = {f.name: (key, f) for key, cls in OBJECTS.items() for f in dataclasses.fields(cls)}
OPTIONS = set(_PARAMS) | set(_FIELDS)  # what a variant may override
# keywords that take Python objects (a layer class; an options object whole, or one per block), which a config
# reaches through the objects' fields instead
PYTHON_ONLY = {"attn_layer", "block_layer", *OBJECTS}


def model_class(options: dict[str, Any]) -> type[VisionTransformer] | type[SamViT]:
    """The model class for create_model's keywords: NaFlexVit for NaFlex inputs (`naflex`), SamViT for SAM's
    windows (`window_size`, `global_attn_indexes`), else the square one."""
    if options.get("naflex") is not None:
        return NaFlexVit
    return SamViT if options.get("window_size") is not None or options.get("global_attn_indexes") else \
        VisionTransformer


def _options_class(tp: Any) -> type | None:
    """The options dataclass of a `SomeOptions | dict | None` constructor argument, else None."""
    classes = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
    return classes[0] if len(classes) == 1 else None


# the constructor's arguments that take an options object or its mapping: {keyword: options class}
MAPPINGS = {k: c for cls in (VisionTransformer, NaFlexVit) for k, tp in typing.get_type_hints(cls.__init__).items()
            if k not in OBJECTS and (c := _options_class(tp)) is not None}


def constructor_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """timm's keywords (`class_token`, `reg_tokens`, `global_pool`, `qk_norm`, ...) -> the model's arguments, each
    options object built (and so validated) once from its fields, or taken whole when given whole, and each mapping
    (`rope=dict(...)`) made its options object (`options_from`: an unknown or mistyped key is one sentence naming
    it)."""
    flat = {k: options_from(MAPPINGS[k], v, k) if k in MAPPINGS else v for k, v in options.items()
            if k not in _FIELDS and k not in OBJECTS}
    for key, cls in OBJECTS.items():
        fields = {f.name: options[f.name] for f in dataclasses.fields(cls) if f.name in options}
        if key in options and options[key] is not None:
            if fields:
                raise ValueError(f"{key}= is given whole and {', '.join(sorted(fields))} set its fields too; put them "
                                 f"into the {cls.__name__}.")
            flat[key] = options[key]
        elif any(isinstance(fields.get(f), (list, tuple)) for f in PER_BLOCK_FIELDS.get(key, ())):
            flat[key] = _per_block_objects(cls, fields, PER_BLOCK_FIELDS[key])
        else:
            flat[key] = cls(**fields)
    return flat


# fields create_model takes one per block (a tuple, as timm's Eva takes num_kv_heads), making one object per block
PER_BLOCK_FIELDS = {"attention": ("num_kv_heads",)}


def _per_block_objects(cls: type, fields: dict[str, Any], per_block: tuple[str, ...]) -> list:
    """One `cls` per block from fields of which some are sequences with one value per block (the Encoder names a
    count that does not match the depth)."""
    given = {f: fields[f] for f in per_block if isinstance(fields.get(f), (list, tuple))}
    lengths = {len(v) for v in given.values()}
    if len(lengths) > 1:
        raise ValueError(f"{', '.join(given)} give {sorted(lengths)} values; give one value, or one per block.")
    return [cls(**{**fields, **{f: v[i] for f, v in given.items()}}) for i in range(lengths.pop())]


def option_types() -> dict[str, Any]:
    """The type of every create_model option (for checking a config.json's model_args before building)."""
    hints = {**typing.get_type_hints(SamViT.__init__), **typing.get_type_hints(VisionTransformer.__init__)}
    for key, cls in OBJECTS.items():
        hints.pop(key, None)
        hints.update(typing.get_type_hints(cls))
    hints["num_kv_heads"] = int | tuple[int, ...] | None  # one per block too (PER_BLOCK_FIELDS)
    return hints


def architecture_defaults(name: str) -> dict[str, Any]:
    """Every create_model option at its value for the variant `name` (the defaults, then the variant's own); an
    unknown name gets the defaults. What a checkpoint's config.json leaves out."""
    defaults = {k: p.default for k, p in _PARAMS.items() if k not in OBJECTS}
    defaults.update({name: f.default for name, (_, f) in _FIELDS.items()})
    own = {k: dataclasses.asdict(options_from(MAPPINGS[k], v, k)) if k in MAPPINGS and isinstance(v, dict) else v
           for k, v in VARIANTS.get(name, {}).items()}  # every field of a mapping, as a built model records it
    return {**defaults, **own}
