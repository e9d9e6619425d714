"""Typed, strict experiment configs: dataclasses loaded from YAML, with dotted command-line overrides.

    cfg = load_config("configs/default.yaml", ["--optim.lr=3e-4", "--run.epochs", "10"])

An unknown key, a value of the wrong type or an out-of-range value raises `ConfigError` with the key's dotted
name. Values given on the command line are parsed as YAML scalars (`3e-4`, `true`, `[0.5, 1.0]`, `null`).
The resolved config is printed at start and saved with every checkpoint (`to_dict` / `from_dict`).

One module per idea: errors.py (ConfigError, OptionError), types.py (a value checked against a field's type),
options.py (`options_from`, the one way an options object is made from a mapping; SparseOptions, NaFlexOptions,
AttentionOptions), model_parts.py (the model parts' options: Rope, RelPos, Stem, NaFlex), choices.py (the names a
model option chooses among, which the layers' registries are held to), schema.py (the sections and their fields),
strict.py (dict to Config and back), checks.py (the tables of choices and ranges, the checks within sections),
combinations.py (`validate`: those and the checks between sections), distill_checks.py (the distill: section's
checks, timm's rule for its two weights), pretrain_checks.py (the pretrain: section's checks), seg_checks.py
(the seg: section's checks), model_args.py (a
config.json's model_args checked), loader.py (YAML and overrides to a Config),
sources.py (data sources from saved configs).
This package imports PyYAML and the standard library only (no torch).
"""

from . import choices
from .checks import (
    ARG_NON_NEGATIVE,
    ARG_POSITIVE,
    ARG_UNIT,
    AUTO,
    CHOICES,
    NON_NEGATIVE,
    POSITIVE,
    TRACKERS,
    UNIT,
)
from .combinations import DATASET_KEYS, check_dataset_keys, validate
from .errors import ConfigError, OptionError
from .loader import StrictLoader, apply_overrides, dump, load_config, parse_overrides, read_yaml
from .model_args import check_model_args
from .model_parts import NaFlex, RelPos, Rope, Stem
from .options import (
    FLAT_SPARSE_KEYS,
    AttentionOptions,
    NaFlexOptions,
    SparseOptions,
    UnknownOption,
    nest_sparse_keys,
    options_from,
)
from .schema import (
    DEFAULT_MODEL,
    INTERPOLATIONS,
    MIN_CROP_PCT,
    AugConfig,
    Config,
    ContrastiveConfig,
    DataConfig,
    DistillConfig,
    ModelConfig,
    OptimConfig,
    PretrainConfig,
    RunConfig,
    SegConfig,
    check_preprocessing,
)
from .sources import SOURCE_KEYS, WITHHELD, check_data_sources, is_remote_source, withhold_remote_sources
from .strict import diff, from_dict, to_dict
from .types import YAML11_BOOLS, check_type

__all__ = ["ConfigError", "OptionError", "UnknownOption", "options_from", "check_type", "choices", "Rope", "RelPos",
           "Stem", "NaFlex", "AttentionOptions", "SparseOptions", "NaFlexOptions", "FLAT_SPARSE_KEYS",
           "nest_sparse_keys",
           "DEFAULT_MODEL", "Config", "ModelConfig", "DataConfig", "AugConfig", "OptimConfig", "RunConfig",
           "ContrastiveConfig", "DistillConfig", "PretrainConfig", "SegConfig", "INTERPOLATIONS",
           "MIN_CROP_PCT", "check_preprocessing", "from_dict", "to_dict", "validate", "diff", "check_dataset_keys",
           "check_model_args", "CHOICES", "POSITIVE", "NON_NEGATIVE", "AUTO", "TRACKERS", "UNIT", "ARG_POSITIVE",
           "ARG_NON_NEGATIVE", "ARG_UNIT", "DATASET_KEYS", "YAML11_BOOLS", "load_config", "read_yaml",
           "parse_overrides", "apply_overrides", "dump", "StrictLoader", "SOURCE_KEYS", "WITHHELD",
           "is_remote_source", "withhold_remote_sources", "check_data_sources"]
