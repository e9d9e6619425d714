"""Options objects: one frozen dataclass per concern with several settings, checked once when made and
passed whole from the YAML to the layer (SparseOptions: model.sparse_attention.*; NaFlexOptions: data.naflex.*;
the model parts' Rope, RelPos, Stem, NaFlex in model_parts.py).

Every options object is made from what a user wrote the same way, `options_from(cls, value)`: None stays None
(the feature off), an instance passes, and a mapping (a YAML section, a config.json's model_args, a keyword such as
`create_model(rope=dict(temperature=100))`) is checked key by key against the dataclass's fields before it is
built: an unknown key is one sentence listing the valid ones, a value of the wrong type one naming the key."""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from .choices import QKV_BIAS
from .errors import ConfigError, OptionError
from .types import check_type

T = TypeVar("T")


class UnknownOption(OptionError):
    """A key that names no field of the options object; `valid` lists the fields (a config names them as its keys)."""

    def __init__(self, owner: str, key: str, valid: list[str]) -> None:
        self.valid = valid
        super().__init__(owner, key, f"is not one of its options; valid: {', '.join(valid)}.")


@functools.cache
def _fields(cls: type) -> tuple[dict[str, Any], tuple[str, ...]]:
    """({field: type}, required fields) of an options dataclass, its string annotations resolved once."""
    hints = typing.get_type_hints(cls)
    init = [f for f in dataclasses.fields(cls) if f.init]
    required = tuple(f.name for f in init if f.default is dataclasses.MISSING
                     and f.default_factory is dataclasses.MISSING)
    return {f.name: hints[f.name] for f in init}, required


def options_from(cls: type[T], value: T | Mapping | None, owner: str | None = None) -> T | None:
    """None, a `cls` or its mapping -> None or a `cls`. A mapping's keys must be the dataclass's fields (UnknownOption
    lists them), its required fields present and each value of its field's type (OptionError naming the key; an int
    becomes a float, a list a tuple where the field says so); the object's own checks then run once, in its
    __post_init__. `owner` names the object in messages (default: the class name)."""
    owner = owner or cls.__name__
    if value is None or isinstance(value, cls):
        return value
    hints, required = _fields(cls)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{owner} takes a {cls.__name__}, a mapping of its options ({', '.join(hints)}) or None, "
                          f"got {value!r}.")
    unknown = sorted(set(value) - set(hints), key=str)
    if unknown:
        raise UnknownOption(owner, str(unknown[0]), sorted(hints))
    missing = [k for k in required if k not in value]
    if missing:
        choices = typing.get_args(hints[missing[0]]) if typing.get_origin(hints[missing[0]]) is Literal else ()
        raise OptionError(owner, missing[0], "is missing; set it" + (
            f" to one of {', '.join(map(repr, choices))}." if choices else "."))
    error = lambda key, problem: OptionError(owner, key, problem)  # noqa: E731
    return cls(**{k: check_type(k, v, hints[k], error) for k, v in value.items()})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class SparseOptions:
    """Dynamic sparse attention, top-k key blocks per query (vit/layers/sparse_attention.py): one object from the
    YAML (`model.sparse_attention: {method: dsa, density: 0.25}`) through create_model, TextEncoder, Block and
    Attention to the layer, checked once here; None in its place means dense attention."""

    method: Literal["dsa", "moba"]  # dsa: a learned indexer (DeepSeek-V3.2); moba: a parameter-free gate (MoBA)
    block_size: int = 128  # tokens per key (and query) block; a sequence shorter than a block is one block
    topk_blocks: int | None = None  # key blocks kept per query, own block and sink included; or
    density: float | None = None  # the kept share of the blocks; both null: 0.125
    select: Literal[None, "token", "block"] = None  # per query token or per query block; null: the method's
    own_block: bool | None = None  # always keep the query's own block; null: the method's (yes)
    sink_block: bool | None = None  # always keep the first block ([CLS]); null: the method's (dsa yes, moba no)
    min_tokens: int | None = None  # dense below this many tokens; null: the measured crossover, 0: never

    def __post_init__(self) -> None:
        def bad(key: str, problem: str) -> OptionError:
            return OptionError("SparseOptions", key, problem)

        if self.method not in ("dsa", "moba"):
            raise bad("method", f"must be 'dsa' or 'moba', got {self.method!r} (dense attention: no options "
                                "object, sparse_attention None).")
        if not _is_int(self.block_size) or self.block_size < 1:
            raise bad("block_size", f"must be a positive integer, got {self.block_size!r}.")
        if self.topk_blocks is not None and self.density is not None:
            raise bad("density", f"and topk_blocks both size the selection ({self.density!r}, {self.topk_blocks!r}); "
                                 "set one of them.")
        if self.topk_blocks is not None and (not _is_int(self.topk_blocks) or self.topk_blocks < 1):
            raise bad("topk_blocks", f"must be a positive integer, got {self.topk_blocks!r}.")
        if self.density is not None and (not isinstance(self.density, (int, float)) or isinstance(self.density, bool)
                                         or not 0 < self.density <= 1):
            raise bad("density", f"must be a number in (0, 1], got {self.density!r}.")
        if self.select not in (None, "token", "block"):
            raise bad("select", f"must be 'token', 'block' or None (the method's), got {self.select!r}.")
        for key in ("own_block", "sink_block"):
            if getattr(self, key) is not None and not isinstance(getattr(self, key), bool):
                raise bad(key, f"must be True, False or None (the method's), got {getattr(self, key)!r}.")
        if self.min_tokens is not None and (not _is_int(self.min_tokens) or self.min_tokens < 0):
            raise bad("min_tokens", f"must be a non-negative integer (0: always sparse), got {self.min_tokens!r}.")

    @classmethod
    def of(cls, value: SparseOptions | Mapping | None) -> SparseOptions | None:
        """None, a SparseOptions or its mapping (a config.json's model_args) -> SparseOptions or None."""
        return options_from(cls, value)


# the most patches data.naflex may give an image: vit.layers.naflex.MAX_GRID_PATCHES, the largest grid a model reads
NAFLEX_MAX_PATCHES = 65536


@dataclass(frozen=True)
class NaFlexOptions:
    """Native aspect ratio (data.naflex, vit/data/naflex.py): every image resized whole to the largest patch grid
    `max_num_patches` allows, fed as patches with coordinates and a padding mask, batched by a token budget."""

    max_num_patches: int = 256  # patches per image at most (timm's max_seq_len; 256 = a 16 x 16 grid's worth)
    # padded tokens per batch (images x the batch's longest sequence); null: data.batch_size x max_num_patches
    tokens_per_batch: int | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.max_num_patches) or self.max_num_patches < 1:
            raise OptionError("NaFlexOptions", "max_num_patches",
                              f"must be a positive integer, got {self.max_num_patches!r}.")
        if self.max_num_patches > NAFLEX_MAX_PATCHES:  # each image enlarged (up to 100x) to fill it, then attended
            raise OptionError("NaFlexOptions", "max_num_patches",
                              f"must be at most {NAFLEX_MAX_PATCHES} (a 256 x 256 grid; published NaFlex models use "
                              f"256 to 4096), got {self.max_num_patches!r}.")
        t = self.tokens_per_batch
        if t is not None and (not _is_int(t) or t < self.max_num_patches):
            raise OptionError("NaFlexOptions", "tokens_per_batch",
                              f"must be a whole number of at least max_num_patches ({self.max_num_patches}), so "
                              f"that the longest image fits a batch, got {t!r}.")


# The flat keys of configs and config.json files saved before `SparseOptions` (model.sparse_attention: dsa,
# model.sparse_block_size: 64, ...): {old key: (field, the value every dense config held)}. Read, never written.
FLAT_SPARSE_KEYS = {"sparse_block_size": ("block_size", 128), "sparse_topk_blocks": ("topk_blocks", None),
                    "sparse_density": ("density", None), "sparse_select": ("select", None),
                    "sparse_own_block": ("own_block", None), "sparse_sink_block": ("sink_block", None),
                    "sparse_min_tokens": ("min_tokens", None)}


def nest_sparse_keys(args: dict, prefix: str = "") -> dict:
    """A model section or config.json model_args written with the flat keys (`sparse_attention: dsa`,
    `sparse_density: 0.25`, ...) -> a copy with one `sparse_attention` mapping; other input is returned as it is.
    A flat option set without a method is refused: it built a dense model without a word."""
    method = args.get("sparse_attention")
    given = {FLAT_SPARSE_KEYS[k][0]: v for k, v in args.items()
             if k in FLAT_SPARSE_KEYS and v != FLAT_SPARSE_KEYS[k][1]}
    if not given and not isinstance(method, str) and not any(k in args for k in FLAT_SPARSE_KEYS):
        return args
    out = {k: v for k, v in args.items() if k not in FLAT_SPARSE_KEYS}
    if method is None and given:
        old = next(k for k in FLAT_SPARSE_KEYS if FLAT_SPARSE_KEYS[k][0] in given)
        raise ConfigError(f"{'config key ' if prefix else ''}'{prefix}{old}' sets sparse attention, which "
                          f"{prefix}sparse_attention leaves off; set {prefix}sparse_attention.method to dsa or moba "
                          "(SparseOptions), or remove the key.")
    if isinstance(method, str):
        out["sparse_attention"] = {"method": method, **given}
    elif given:
        raise ConfigError(f"{'config key ' if prefix else ''}'{prefix}sparse_attention' is an options object and flat "
                          f"sparse_* keys are given too; move {', '.join(given)} into it.")
    return out


@dataclass(frozen=True)
class AttentionOptions:
    """What a block's attention computes (vit/layers/attention.py), one object from create_model's timm keywords
    (`qkv_bias`, `qk_norm`, `fused_attn`, `sparse_attention`) through the Encoder to the layer, checked once here.
    The Encoder takes one for every block or a sequence with one per block (as timm's Eva takes per-block values).
    Saved names and inner norms are the block's parts (vit.layers.BlockParts: qkv_fused, scale_attn_norm)."""

    # a bias on q, k and v; or the string "qv": q and v only, k fixed at zero (Eva, BEiT). Typed bool as the
    # constructor was, so that a config.json's model_args check keeps its message; __post_init__ takes "qv"
    qkv_bias: bool | Literal[QKV_BIAS] = True
    qk_norm: bool = False  # a norm on each head's queries and keys before the scores (q_norm / k_norm, timm's)
    fused_attn: bool = True  # F.scaled_dot_product_attention; False: the explicit softmax path always
    # dynamic sparse attention (SparseOptions or its mapping); None: dense
    sparse_attention: SparseOptions | dict | None = None
    # grouped-query attention (Ainslie et al., 2023): key / value heads, each shared by num_heads / num_kv_heads
    # query heads; None: one per query head. create_model takes one per block too (a tuple, as timm's Eva)
    num_kv_heads: int | None = None

    def __post_init__(self) -> None:
        if self.qkv_bias not in (True, False, "qv") or (self.qkv_bias != "qv" and not isinstance(self.qkv_bias, bool)):
            raise ValueError(f"qkv_bias must be true, false or 'qv' (q and v biases only), got {self.qkv_bias!r}.")
        for key in ("qk_norm", "fused_attn"):
            if not isinstance(getattr(self, key), bool):
                raise OptionError("AttentionOptions", key, f"must be true or false, got {getattr(self, key)!r}.")
        object.__setattr__(self, "sparse_attention", SparseOptions.of(self.sparse_attention))
        if self.num_kv_heads is not None and (not _is_int(self.num_kv_heads) or self.num_kv_heads < 1):
            raise OptionError("AttentionOptions", "num_kv_heads",
                              f"must be a positive integer or None (one per query head), got {self.num_kv_heads!r}.")
