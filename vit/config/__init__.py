"""Typed, strict experiment configs: dataclasses loaded from YAML, with dotted command-line overrides.

    cfg = load_config("configs/default.yaml", ["--optim.lr=3e-4", "--run.epochs", "10"])

An unknown key, a value of the wrong type or an out-of-range value raises `ConfigError` with the key's dotted
name. Values given on the command line are parsed as YAML scalars (`3e-4`, `true`, `[0.5, 1.0]`, `null`).
The resolved config is printed at start and saved with every checkpoint (`to_dict` / `from_dict`).

One module per idea: errors.py (ConfigError, OptionError), options.py (the options objects a config nests:
SparseOptions, AttentionOptions), schema.py (the sections and their fields), checks.py (dict to Config, the
tables of choices and ranges, the checks), loader.py (YAML and overrides to a Config), sources.py (data sources
from saved configs).
This package imports PyYAML and the standard library only (no torch).
"""

from .checks import (
    ARG_NON_NEGATIVE,
    ARG_POSITIVE,
    ARG_UNIT,
    AUTO,
    CHOICES,
    DATASET_KEYS,
    NON_NEGATIVE,
    POSITIVE,
    TRACKERS,
    UNIT,
    YAML11_BOOLS,
    check_dataset_keys,
    check_model_args,
    diff,
    from_dict,
    to_dict,
    validate,
)
from .errors import ConfigError, OptionError
from .loader import StrictLoader, apply_overrides, dump, load_config, parse_overrides, read_yaml
from .options import FLAT_SPARSE_KEYS, AttentionOptions, NaFlexOptions, SparseOptions, nest_sparse_keys
from .schema import (
    DEFAULT_MODEL,
    INTERPOLATIONS,
    MIN_CROP_PCT,
    AugConfig,
    Config,
    ContrastiveConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    check_preprocessing,
)
from .sources import SOURCE_KEYS, WITHHELD, check_data_sources, is_remote_source, withhold_remote_sources

__all__ = ["ConfigError", "OptionError", "AttentionOptions", "SparseOptions", "NaFlexOptions", "FLAT_SPARSE_KEYS",
           "nest_sparse_keys",
           "DEFAULT_MODEL", "Config", "ModelConfig", "DataConfig", "AugConfig", "OptimConfig", "RunConfig",
           "ContrastiveConfig", "INTERPOLATIONS",
           "MIN_CROP_PCT", "check_preprocessing", "from_dict", "to_dict", "validate", "diff", "check_dataset_keys",
           "check_model_args", "CHOICES", "POSITIVE", "NON_NEGATIVE", "AUTO", "TRACKERS", "UNIT", "ARG_POSITIVE",
           "ARG_NON_NEGATIVE", "ARG_UNIT", "DATASET_KEYS", "YAML11_BOOLS", "load_config", "read_yaml",
           "parse_overrides", "apply_overrides", "dump", "StrictLoader", "SOURCE_KEYS", "WITHHELD",
           "is_remote_source", "withhold_remote_sources", "check_data_sources"]
