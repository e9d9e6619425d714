"""The model a config describes: the config's `model` section passed straight to `vit.create_model`.

Every field of `ModelConfig` is a `create_model` argument of the same name, or names a setter the model has
(`grad_checkpointing` -> `model.set_grad_checkpointing(value)`, timm's convention for switches that leave
the weights alone), so adding a model option is one parameter (or setter) of `VisionTransformer` and one line
in `ModelConfig` (its choices, if any, in the field's `Literal` type); nothing here changes. A field that is
neither fails with its name (`check_model_config`, run by `build_model` and by tests/test_factory.py).

Which fields are passed: those the config decides whatever the weights say (`ALWAYS`: image size, channels and
drop rates, which the data pipeline and the recipe own), and every other field whose value is set (not None)
and differs from its `ModelConfig` default. Fields left at their default defer to the variant (`name`), or,
when fine-tuning or reloading, to the architecture the weights' config.json records (its `model_args`),
which the model must rebuild to load them.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from .config import DEFAULT_MODEL, Config, ConfigError, ModelConfig
from .hub import weights_architecture
from .vision import _OPTIONS, VARIANTS, VisionTransformer, create_model

__all__ = ["build_model", "model_kwargs", "check_model_config", "resolve_name"]

ALWAYS = ("img_size", "in_chans", "drop_rate", "attn_drop_rate", "drop_path_rate")
# create_model's own arguments (not architecture overrides), passed by name below
_FACTORY_ARGS = ("name", "pretrained")
_CREATE_ARGS = set(inspect.signature(create_model).parameters) - {"overrides"}


def _is_setter(key: str) -> bool:
    return key not in _OPTIONS and key not in _CREATE_ARGS and callable(getattr(VisionTransformer, f"set_{key}", None))


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
        if f.name not in _FACTORY_ARGS and f.name not in _OPTIONS and f.name not in _CREATE_ARGS \
                and not _is_setter(f.name):
            raise ConfigError(f"config key 'model.{f.name}' is not an option of vit.create_model nor a "
                              f"set_{f.name} method of the model; add one to VisionTransformer or remove the key "
                              "from ModelConfig.")


def resolve_name(cfg: Config) -> Config:
    """`cfg` with model.name set: as given, else the architecture of the weights model.pretrained names (a hub
    name, hf-hub:, local-dir: or a folder; read from the registry or the cache's config.json, no weights
    loaded), else DEFAULT_MODEL. A weights file does not say its architecture: model.name must then be set."""
    m = cfg.model
    if m.name is not None:
        return cfg
    arch = weights_architecture(m.pretrained, VARIANTS) or DEFAULT_MODEL
    return dataclasses.replace(cfg, model=dataclasses.replace(m, name=arch))


def build_model(cfg: Config, num_classes: int, pretrained: bool = False,
                saved: dict | None = None) -> VisionTransformer:
    """The model `cfg.model` describes, with a `num_classes`-way head (the only place the config meets
    `create_model`). With `pretrained`, loaded from the weights `model.pretrained` names (vit.hub). `saved`: a
    checkpoint's config.json, whose architecture and model_args (which hold what came from the pretrained
    weights) fill in what the config leaves at its defaults. Returns a VisionTransformer in training mode."""
    m = cfg.model
    check_model_config(m)
    overrides = {**model_kwargs(m), "num_classes": num_classes}
    setters = {k: overrides.pop(k) for k in list(overrides) if _is_setter(k)}
    name, base = (saved["architecture"], saved.get("model_args", {})) if saved else (m.name or DEFAULT_MODEL, {})
    model = create_model(name, pretrained=m.pretrained if pretrained else None, **{**base, **overrides})
    for key, value in setters.items():  # e.g. model.set_grad_checkpointing(True)
        getattr(model, f"set_{key}")(value)
    return model
