"""Building models: `create_model` (a named variant, its weights, its options; timm's `_factory.py`, above the
model files, so that they know nothing of hubs) and the model a config describes (`build_model`: the config's
`model` section passed straight to `create_model`).

Every field of `ModelConfig` is a `create_model` argument of the same name, or names a setter the model has
(`grad_checkpointing` -> `model.set_grad_checkpointing(value)`, timm's convention for switches that leave
the weights alone), so adding a model option is one parameter (or setter) of `VisionTransformer` and one line
in `ModelConfig` (its choices, if any, in the field's `Literal` type); nothing here changes. A field that is
neither fails with its name (`check_model_config`, run by `build_model` and by tests/test_build.py).

Which fields are passed: those the config decides whatever the weights say (`ALWAYS`: image size, channels and
drop rates, which the data pipeline and the recipe own), and every other field whose value is set (not None)
and differs from its `ModelConfig` default. Fields left at their default defer to the variant (`name`), or,
when fine-tuning or reloading, to the architecture the weights' config.json records (its `model_args`),
which the model must rebuild to load them.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

from torch import nn

from ..config import (
    DEFAULT_MODEL,
    Config,
    ConfigError,
    ModelConfig,
    Stem,
    check_model_args,
    nest_sparse_keys,
    options_from,
)
from ..hub.names import resolve_source, weights_architecture
from ..hub.weights import check_depth_fits, load_pretrained
from ..layers import to_2tuple
from .features import features_only_model
from .model_size import check_size, stacked_size
from .variants import REFUSED, VARIANTS
from .vision_transformer import VisionTransformer
from .vit_options import MAPPINGS, OPTIONS, constructor_kwargs, model_class, option_types

__all__ = ["check_buildable", "create_model", "list_models", "pretrained_cfg_of", "build_model", "model_kwargs",
           "check_model_config", "resolve_name"]


def list_models() -> list[str]:
    return sorted(VARIANTS)


_SIZE_KEYS = ("embed_dim", "depth", "mlp_ratio", "img_size", "patch_size", "num_classes", "reg_tokens", "rel_pos",
              "stem", "attn_pool_mlp_ratio", "naflex")


def estimated_params(kwargs: dict, keep: int = 16) -> float | None:
    """The parameters and buffer entries `VisionTransformer(**kwargs)` (create_model's keywords) would allocate,
    counted on the meta device with the blocks and each stem stage cut to one and two copies (vit.models.model_size):
    every option that makes a tensor counts. None when the arguments are not ones the constructor takes (it then
    names what is wrong); inf past torch's 64-bit sizes."""
    try:
        stem = options_from(Stem, kwargs.get("stem"), "stem")
    except ValueError:  # the constructor names what is wrong
        return None
    layers = stem.layers if isinstance(stem, Stem) and stem.kind == "resnetv2" else ()
    counts = {"depth": kwargs.get("depth", 12), **{f"stage{i}": n for i, n in enumerate(layers)}}

    def build(n: dict[str, int]) -> VisionTransformer:
        cut = {**kwargs, "depth": n["depth"]}
        if layers:
            cut["stem"] = dataclasses.replace(stem, layers=tuple(n[f"stage{i}"] for i in range(len(layers))))
        return model_class(cut)(**constructor_kwargs(cut))

    return stacked_size(build, counts, keep)


def check_buildable(name: str) -> None:
    """Raise the one sentence that names what a timm ViT-family architecture (with or without a tag) needs and
    this library does not build yet (vit.models.variants.REFUSED); other names pass through."""
    arch = name.split(".")[0]
    if arch in REFUSED:
        raise ValueError(f"{name} is a timm model this library does not build yet: it needs {REFUSED[arch]}; "
                         f"the {len(VARIANTS)} architectures it builds are listed by vit.list_models().")


def create_model(
    name: str,
    pretrained: bool | str | Path | None = None,
    cache_dir: str | Path | None = None,
    features_only: bool = False,
    out_indices: int | list[int] | tuple[int, ...] = 3,
    feature_cls: str = "getter",
    token_reduction: str | None = None,
    **overrides,
) -> nn.Module:
    """Build a named variant with optional overrides, e.g. `create_model('vit_small_patch16_224',
    img_size=64, num_classes=10)`. As in timm, `name` may carry a tag (`vit_base_patch16_224.augreg_in21k`) or a
    source (`hf-hub:org/repo[@rev]`, `local-dir:/folder`), and `pretrained=True` loads the weights it names
    from the Hugging Face cache (see `vit.hub`); `pretrained` may also be another such name, a folder or a
    weights file. Weights go through `vit.load_pretrained` (positions resampled, head replaced, input channels
    adapted), and `model.pretrained_cfg` carries their preprocessing (mean, std, crop_pct, interpolation); a
    model without weights gets timm's registry entry for its name.
    `features_only=True` returns timm's feature model instead: forward gives the outputs of the blocks in
    `out_indices` (default: the last 3) as (B, D, h, w) maps (see vit.models.features). `token_reduction` is a spec
    such as "merge:8" or "topk:0.7@3,6,9" (see `VisionTransformer.set_token_reduction`)."""
    if not isinstance(name, str):
        raise TypeError(f"create_model takes a model name (a str such as 'vit_small_patch16_224', "
                        f"'hf-hub:org/repo' or 'local-dir:/folder'), got {type(name).__name__} {name!r:.60}.")
    check_buildable(name)
    if isinstance(pretrained, str):
        check_buildable(pretrained)
    source = resolve_source(name, pretrained, VARIANTS, cache_dir)  # None: a plain name, no weights
    overrides = nest_sparse_keys(overrides)  # the flat sparse_* keys of configs saved before SparseOptions
    new_head, given = True, overrides
    if source is not None:  # architecture and defaults from the weights' config; the overrides still win
        name, overrides, new_head = _weights_options(source, overrides)
    kwargs = _variant_kwargs(name, overrides)
    # the caller's values checked as a config's are (NaN init_values or drop rates, depth -1, num_heads 0 built a
    # model that was silently wrong or failed deep inside torch), with the variant's: embed_dim 10**8 beside its
    # 3 heads could not be counted on the meta device and allocated a 300 GB patch embedding before failing
    checked = check_model_args({**{k: VARIANTS[name][k] for k in ("embed_dim", "num_heads") if k in VARIANTS[name]},
                                **given}, option_types(), f"create_model({name!r})")
    kwargs.update({k: v for k, v in checked.items() if k in given})  # as typed: drop_rate '0.1' is 0.1
    shown = ", ".join(f"{k}={kwargs[k]!r:.40}" for k in _SIZE_KEYS if kwargs.get(k) not in (None, 0, False))
    where = f"; its options come from {source.config}" if source is not None and source.config else ""
    check_size(estimated_params(kwargs), source.name if source else name, shown + where,
               "check the model's size options")
    if source is not None:
        check_depth_fits(kwargs.get("depth"), source.weights, source.name)
    model = model_class(kwargs)(**constructor_kwargs(kwargs))
    model._variant = name
    # what a checkpoint's config.json records (timm's name for it), options objects as their mappings
    model._model_args = {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in kwargs.items()}
    if source is not None:
        model.pretrained_cfg = source.pretrained_cfg  # sets default_cfg too (timm's older alias)
        if pretrained:
            load_pretrained(model, source, cache_dir=cache_dir, new_head=new_head)
    if token_reduction is not None:
        model.set_token_reduction(token_reduction)
    if features_only:
        return features_only_model(model, model.pretrained_cfg, out_indices, feature_cls)
    return model


def _weights_options(source, overrides: dict) -> tuple[str, dict, bool]:
    """The architecture, options and whether the head is new for weights `source` (vit.hub.names.resolve_source):
    the weights' config.json model_args, checked, under the caller's `overrides`."""
    implied = nest_sparse_keys(source.model_kwargs())
    where = f"{source.name}: {source.config or 'its pretrained config'}"
    implied.update(check_model_args(implied, option_types(), where))
    lacking = sorted(set(implied) - OPTIONS)
    if source.format != "timm" and lacking:  # converted weights (vit.hub.hf_vision, vit.hub.open_clip_weights)
        raise ValueError(f"{source.name} ({source.format} format) needs {', '.join(lacking)}, which this "
                         "library's VisionTransformer does not have yet; load it with timm or its own library "
                         "meanwhile.")
    # a head unlike the weights' is for fine-tuning, when the caller asked for another class count; a model
    # loaded as it is (no num_classes, or the one its config says) must fit its weights' head
    new_head = source.file is not None or overrides.get("num_classes", implied.get("num_classes")) \
        != implied.get("num_classes")
    return source.architecture, {**implied, **overrides}, new_head


def _variant_kwargs(name: str, overrides: dict) -> dict:
    """The variant `name`'s options under `overrides` (unknown names and options refused, naming the valid ones),
    options given as mappings made their objects here, once, so that config.json records every field of each."""
    if name not in VARIANTS:
        close = sorted(m for m in VARIANTS if name.split("_patch")[0] in m)[:8] or list_models()[:8]
        raise ValueError(f"unknown model {name!r}; known models include {', '.join(close)} (vit.list_models() "
                         f"lists all {len(VARIANTS)}).")
    unknown = sorted(set(overrides) - OPTIONS)
    if unknown:
        raise TypeError(
            f"unknown model option(s) {', '.join(map(repr, unknown))} for {name}; "
            f"valid options are: {', '.join(sorted(OPTIONS))}."
        )
    kwargs = {k: options_from(MAPPINGS[k], v, k) if k in MAPPINGS else v for k, v in {**VARIANTS[name],
                                                                                        **overrides}.items()}
    if isinstance(kwargs.get("img_size"), list):
        kwargs["img_size"] = to_2tuple(kwargs["img_size"])
    _check_patches_tile(name, kwargs)
    return kwargs


def _check_patches_tile(name: str, kwargs: dict) -> None:
    """An image size the patch size does not divide is refused, unless it is the variant's own: timm then drops
    the pixels the grid leaves (so400m at 384 px, patch 14), and PatchEmbed keeps that rule for it."""
    size, patch = kwargs.get("img_size", 224), kwargs.get("patch_size", 16)
    own = (VARIANTS[name].get("img_size", 224), VARIANTS[name].get("patch_size", 16))
    if kwargs.get("naflex") is not None or not all(isinstance(v, (int, tuple)) for v in (size, patch)) or \
            (to_2tuple(size), to_2tuple(patch)) == (to_2tuple(own[0]), to_2tuple(own[1])):
        return
    for side, s, p in zip(("height", "width"), to_2tuple(size), to_2tuple(patch)):
        if isinstance(s, int) and isinstance(p, int) and p > 0 and s % p:
            raise ValueError(f"image {side} {s} is not divisible by patch size {p}; pick an image size that is a "
                             "multiple of the patch size.")


def pretrained_cfg_of(m: ModelConfig) -> dict | None:
    """The pretrained config (mean, std, crop_pct, interpolation, ...) of the weights `m.pretrained` names, read
    from timm's registry or the hub cache without loading any weights; None when the config names none. What
    train.py tells the data pipeline (`vit.data.resolve_data_config`), which never looks a model up itself."""
    if not m.pretrained:
        return None
    for name in (m.name, m.pretrained):
        if isinstance(name, str):
            check_buildable(name)
    return resolve_source(m.name or weights_architecture(m.pretrained, VARIANTS) or DEFAULT_MODEL, m.pretrained,
                          VARIANTS).pretrained_cfg


def resolve_name(cfg: Config) -> Config:
    """`cfg` with model.name set: as given, else the architecture of the weights model.pretrained names (a hub
    name, hf-hub:, local-dir: or a folder; read from the registry or the cache's config.json, no weights
    loaded), else DEFAULT_MODEL. A weights file does not say its architecture: model.name must then be set."""
    m = cfg.model
    if m.name is not None or cfg.data.dataset == "text_csv":  # a text model is named by model.pretrained alone
        return cfg
    arch = weights_architecture(m.pretrained, VARIANTS) or DEFAULT_MODEL
    return dataclasses.replace(cfg, model=dataclasses.replace(m, name=arch))

ALWAYS = ("img_size", "in_chans", "drop_rate", "attn_drop_rate", "drop_path_rate")
# create_model's own arguments (not architecture overrides), passed by name below
_FACTORY_ARGS = ("name", "pretrained")
_CREATE_ARGS = set(inspect.signature(create_model).parameters) - {"overrides"}


def _is_setter(key: str) -> bool:
    return key not in OPTIONS and key not in _CREATE_ARGS and callable(getattr(VisionTransformer, f"set_{key}", None))


def model_kwargs(m: ModelConfig) -> dict[str, Any]:
    """The `create_model` keyword arguments (besides name and pretrained) and setter values that the model
    section sets: {key: value}, a setter's key included (see `build_model`)."""
    default = type(m)()
    out = {}
    for f in dataclasses.fields(m):
        value = getattr(m, f.name)
        if f.name in _FACTORY_ARGS:
            continue
        if value is not None and (f.name in ALWAYS or value != getattr(default, f.name)):  # in_chans null: the data's
            out[f.name] = value
    return out


def check_model_config(m: ModelConfig) -> None:
    """Raise ConfigError naming a `model.` key that `create_model` does not take (a field added to ModelConfig
    without its model option). Cheap: nothing is built."""
    for f in dataclasses.fields(m):
        if f.name not in _FACTORY_ARGS and f.name not in OPTIONS and f.name not in _CREATE_ARGS \
                and not _is_setter(f.name):
            raise ConfigError(f"config key 'model.{f.name}' is not an option of vit.create_model nor a "
                              f"set_{f.name} method of the model; add one to VisionTransformer or remove the key "
                              "from ModelConfig.")


def build_model(cfg: Config, num_classes: int, pretrained: bool = False,
                saved: dict | None = None) -> VisionTransformer:
    """The model `cfg.model` describes, with a `num_classes`-way head (the only place the config meets
    `create_model`). With `pretrained`, loaded from the weights `model.pretrained` names (vit.hub.names). `saved`: a
    checkpoint's config.json, whose architecture and model_args (which hold what came from the pretrained
    weights) fill in what the config leaves at its defaults. Returns a VisionTransformer in training mode."""
    m = cfg.model
    check_model_config(m)
    overrides = {**model_kwargs(m), "num_classes": num_classes}
    setters = {k: overrides.pop(k) for k in list(overrides) if _is_setter(k)}
    name, base = (saved["architecture"], nest_sparse_keys(saved.get("model_args", {}))) if saved \
        else (m.name or DEFAULT_MODEL, {})
    naflex_data = getattr(cfg.data, "naflex", None) is not None
    if naflex_data and "naflex" not in {**VARIANTS.get(name.split(".")[0], {}), **base, **overrides}:
        # data.naflex feeds patch batches: the model takes them through NaFlex embeddings (vit.layers.naflex), whose
        # weights are named apart from a square ViT's, so square pretrained weights do not fit them
        if pretrained and m.pretrained:
            raise ConfigError(f"data.naflex feeds patches of every aspect ratio, and {name} is a square ViT whose "
                              "pretrained weights fit only square images; name a naflexvit_* model (timm's NaFlex "
                              "weights) or train from scratch (model.pretrained=null).")
        overrides["naflex"] = {}
    model = create_model(name, pretrained=m.pretrained if pretrained else None, **{**base, **overrides})
    for key, value in setters.items():  # e.g. model.set_grad_checkpointing(True)
        getattr(model, f"set_{key}")(value)
    return model
