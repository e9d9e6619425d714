"""The options objects of a model's parts that `create_model` takes as mappings, defined here without torch so that a
config holds them (`model.rope.temperature`, `model.stem.layers`, ...) under the names their layers read: Rope
(vit/layers/rope.py), RelPos (rel_pos.py), Stem (hybrid_embed.py), NaFlex (naflex.py). Each is checked once when
made and raises OptionError naming its field; `options_from` (options.py) makes one from a mapping."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .choices import INTERP_MODES, REL_POS_KINDS, ROPE_KINDS, STEM_KINDS
from .errors import OptionError

__all__ = ["MAX_GRID_OFFSET", "SCALE_RANGE", "NaFlex", "RelPos", "Rope", "Stem"]

SCALE_RANGE = (1e-6, 1e12)  # rope temperature and periods: every real model's (10 .. 10000) and far beyond
MAX_GRID_OFFSET = 1e6  # patches


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _check_bools(obj: Any, names: tuple[str, ...]) -> None:
    for name in names:
        if not isinstance(getattr(obj, name), bool):
            raise OptionError(type(obj).__name__, name, f"must be true or false, got {getattr(obj, name)!r}.")


def _check_choice(obj: Any, name: str, choices: tuple) -> None:
    if getattr(obj, name) not in choices:
        raise OptionError(type(obj).__name__, name, f"must be one of {', '.join(map(repr, choices))}, got "
                                                    f"{getattr(obj, name)!r}.")


def _pair(obj: Any, name: str, what: str) -> None:
    """An int or a pair of whole numbers > 0, stored as the pair."""
    value = getattr(obj, name)
    pair = (value, value) if isinstance(value, int) else tuple(value) if isinstance(value, (list, tuple)) else ()
    if len(pair) != 2 or not all(_whole(s) for s in pair):
        raise OptionError(type(obj).__name__, name, f"is {what}, two whole numbers > 0; got {value!r}.")
    object.__setattr__(obj, name, pair)


@dataclass(frozen=True)
class Rope:
    """Which rotary positions a model's attention uses (timm's Eva keyword names in comments), validated once."""

    # axial (EVA02, RoPE-ViT; timm's rope_type='cat'), dinov3 or mixed (RoPE-Mixed: frequencies learned per block
    # and head)
    kind: Literal[ROPE_KINDS] = "axial"
    temperature: float = 10000.0  # rope_temperature; DINOv3 uses 100, RoPE-Mixed 10 (its frequencies' start)
    rotate_half: bool = False  # rope_rotate_half: pairs (i, i + d/2) instead of (2i, 2i + 1)
    grid_offset: float = 0.0  # rope_grid_offset, added to every coordinate
    grid_indexing: Literal["ij", "xy"] = "ij"  # ij: (row, column) angles; xy: (column, row)
    ref_grid: tuple[int, int] | None = None  # axial only: ref_feat_shape, positions rescaled onto this grid
    # dinov3 only: divide each axis by its size (separate), or both by the smaller (min) or larger (max)
    normalize_coords: Literal["separate", "min", "max"] = "separate"
    min_period: float | None = None  # dinov3 only: periods min..max instead of the temperature schedule
    max_period: float | None = None  # dinov3 only: with min_period

    def __post_init__(self) -> None:
        bad = lambda key, problem: OptionError("Rope", key, problem)  # noqa: E731
        _check_choice(self, "kind", ROPE_KINDS)
        _check_bools(self, ("rotate_half",))
        # bounds that keep every angle finite in float32 on any grid (NaN / inf would make every table NaN; a
        # temperature or period far outside them, or an offset of 1e38, overflows or underflows the angles)
        for key in ("temperature", "min_period", "max_period"):
            value = getattr(self, key)
            if (value is not None or key == "temperature") and not (_number(value)
                                                                    and SCALE_RANGE[0] <= value <= SCALE_RANGE[1]):
                example = " (10000 for EVA02, 100 for DINOv3)" if key == "temperature" else ""
                raise bad(key, f"must be a positive finite number from {SCALE_RANGE[0]:g} to {SCALE_RANGE[1]:g}"
                               f"{example}, got {value!r}.")
        if not (_number(self.grid_offset) and abs(self.grid_offset) <= MAX_GRID_OFFSET):  # `not <=`: NaN too
            raise bad("grid_offset", f"must be a finite number of patches within +-{MAX_GRID_OFFSET:g} (0 for EVA02, "
                                     f"1 for PE), got {self.grid_offset!r}.")
        _check_choice(self, "grid_indexing", ("ij", "xy"))
        _check_choice(self, "normalize_coords", ("separate", "min", "max"))
        if self.ref_grid is not None:
            if self.kind != "axial":
                raise bad("ref_grid", "rescales 'axial' positions only; DINOv3's coordinates are already [-1, 1].")
            _pair(self, "ref_grid", "a rotary grid (height, width) in patches")
        if self.kind == "mixed" and self.rotate_half:
            raise bad("rotate_half", "pairs channels (i, i + d/2), and 'mixed' rotary positions pair (2i, 2i + 1); set "
                                     "rotate_half=false.")
        if (self.min_period is None) != (self.max_period is None):
            raise bad("min_period", "comes with max_period: give both min_period and max_period, or neither (then "
                                    "the temperature sets periods).")


@dataclass(frozen=True)
class RelPos:
    """Which relative position bias a model's attention adds (timm's keyword names in comments), validated once."""

    kind: Literal[REL_POS_KINDS] = "mlp"  # mlp (timm's VisionTransformerRelPos rel_pos_type='mlp') or table (BEiT's)
    hidden_dim: int = 128  # rel_pos_dim: the MLP's hidden width
    shared: bool = False  # shared_rel_pos: one bias for every block (timm's srelpos models)

    def __post_init__(self) -> None:
        _check_choice(self, "kind", REL_POS_KINDS)
        if not _whole(self.hidden_dim):
            raise OptionError("RelPos", "hidden_dim", f"must be a whole number > 0, got {self.hidden_dim!r}.")
        _check_bools(self, ("shared",))


@dataclass(frozen=True)
class Stem:
    """Which convolutional stem makes the tokens (timm's entry-point arguments in comments), validated once."""

    kind: Literal[STEM_KINDS] = "resnetv2"  # resnetv2 (BiT), mci (MobileCLIP) or vitamin (ViTamin's MBConv)
    layers: tuple[int, ...] = ()  # resnetv2: residual blocks per stage, [] for the stem alone
    widths: tuple[int, ...] = ()  # vitamin: the two MBConv stages' widths (the first is also the stem's)

    def __post_init__(self) -> None:
        bad = lambda key, problem: OptionError("Stem", key, problem)  # noqa: E731
        _check_choice(self, "kind", STEM_KINDS)
        for key in ("layers", "widths"):
            value = getattr(self, key)
            if not isinstance(value, (list, tuple)) or not all(_whole(n) for n in value):
                raise bad(key, f"must be a list of whole numbers > 0, got {value!r}.")
            object.__setattr__(self, key, tuple(value))
        if self.kind == "resnetv2" and len(self.layers) > 4:  # timm's ResNetV2 zips them with 4 stage widths
            raise bad("layers", f"has at most 4 stages in a resnetv2 stem (timm's ResNetV2), got {self.layers}.")
        if self.kind == "vitamin" and len(self.widths) != 2:
            raise bad("widths", f"are a ViTamin stem's two MBConv stages: give widths=(w1, w2), got {self.widths}.")

    @property
    def stride(self) -> int:
        """r: input pixels per feature-map cell."""
        return 4 * 2 ** max(len(self.layers) - 1, 0) if self.kind == "resnetv2" else 16

    @property
    def projects(self) -> bool:
        """Whether a `proj` convolution maps the features to D (MobileCLIP's and ViTamin's stems end at D)."""
        return self.kind == "resnetv2"


@dataclass(frozen=True)
class NaFlex:
    """How a NaFlex model resamples its learned positions per image (timm's NaFlexVitCfg names in comments)."""

    pos_grid: tuple[int, int] | None = None  # pos_embed_grid_size: the table's (h0, w0); null: img_size // patch
    factorized: bool = False  # pos_embed='factorized': a row table plus a column table (linear resampling)
    interp_mode: Literal[INTERP_MODES] = "bicubic"  # pos_embed_interp_mode
    antialias: bool = True  # pos_embed_antialias (when shrinking; PyTorch's antialiased kernels also upsample)
    align_corners: bool = False  # pos_embed_align_corners
    ar_preserving: bool = False  # pos_embed_ar_preserving: resample to (L, L), L = max(h, w), keep the top-left

    def __post_init__(self) -> None:
        _check_choice(self, "interp_mode", INTERP_MODES)
        _check_bools(self, ("factorized", "antialias", "align_corners", "ar_preserving"))
        if self.pos_grid is not None:
            _pair(self, "pos_grid", "the position table's (rows, columns)")
