"""A model's construction arguments read from a file (a checkpoint's or hub folder's config.json `model_args`),
checked as the config's model keys are, before anything is built."""

from __future__ import annotations

from typing import Any

from .checks import (
    ARG_NON_NEGATIVE,
    ARG_POSITIVE,
    ARG_UNIT,
    NON_NEGATIVE,
    POSITIVE,
    UNIT,
    check_mlp_width,
    check_ranges,
)
from .errors import ConfigError
from .strict import optional_dataclass, options_at
from .types import check_type


def check_model_args(args: dict[str, Any], hints: dict[str, Any], where: str) -> dict[str, Any]:
    """`args` (a config.json's model_args, with the class count and channels of its pretrained_cfg) checked like
    the config's model keys: the type of `hints` (the model's signature; `int | tuple[int, int]` takes an int or a
    pair), options objects by their fields (`options_from`), the ranges of the config's model.* keys, finite
    numbers, num_heads dividing embed_dim, patch_size dividing img_size. Keys not in `hints` are left to
    create_model, which names them.
    Returns the plain (not options-object) values as their types ('0.1' as 0.1), for the caller to build with.
    Raises ConfigError: `where`, then 'model_args.<key>' and what is wrong."""
    flat = {}
    try:
        for key, value in args.items():
            if key not in hints:
                continue
            dotted, options = f"model_args.{key}", optional_dataclass(hints[key])
            if options is not None:
                options_at(dotted, options, value)
            else:
                flat[dotted] = check_type(dotted, value, hints[key])
        named = lambda keys, extra: {f"model_args.{k[6:]}" for k in keys if k.startswith("model.")} | {  # noqa: E731
            f"model_args.{k}" for k in extra}
        check_ranges(flat, named(POSITIVE, ARG_POSITIVE), named(NON_NEGATIVE, ARG_NON_NEGATIVE),
                     named(UNIT, ARG_UNIT))
        dim, heads = flat.get("model_args.embed_dim"), flat.get("model_args.num_heads")
        check_mlp_width(dim, {k: flat.get(f"model_args.{k}") for k in ("mlp_ratio", "attn_pool_mlp_ratio")},
                        "model_args")
        size, patch = flat.get("model_args.img_size"), flat.get("model_args.patch_size")
        sides = size if isinstance(size, (list, tuple)) else [size]
        if isinstance(patch, int) and patch > 0 and any(isinstance(n, int) and n % patch for n in sides):
            raise ConfigError(f"config key 'model_args.patch_size' ({patch}) must divide 'model_args.img_size' "
                              f"({size}).")
        if dim and heads and dim % heads:
            raise ConfigError(f"config key 'model_args.num_heads' ({heads}) must divide 'model_args.embed_dim' "
                              f"({dim}).")
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    return {k.removeprefix("model_args."): v for k, v in flat.items()}
