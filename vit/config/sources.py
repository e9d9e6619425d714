"""Trust in data sources: a command or URL from a saved config is withheld until the user passes it again."""

from __future__ import annotations

import re

from .errors import ConfigError
from .schema import Config

# A data source can run a command (`pipe:cmd`, which webdataset hands to a shell) or fetch from anywhere (a URL).
# It is honoured when the user typed it (command line, a config file they passed), never when it comes from a
# config saved in a folder they were handed (a checkpoint's config.yaml): `vit.models.checkpoint.load_checkpoint` marks
# such values with WITHHELD, and `vit.data.build_datasets` refuses a marked one unless the user passes it again.

SOURCE_KEYS = ("root", "train_split", "val_split")  # data.* keys that name where samples come from
WITHHELD = "withheld-saved-source:"  # prefix of a value withheld from a saved config; nothing opens such a name
_SCHEME = re.compile(r"(?:^|[^A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*:")  # pipe:, https:, s3:, ... anywhere


def is_remote_source(value: str | None) -> bool:
    """A value that names a command or a URL (any `scheme:`, also inside a brace pattern), not a local path."""
    return isinstance(value, str) and bool(_SCHEME.search(value))


def withhold_remote_sources(cfg: Config) -> list[str]:
    """Mark, in a config read from a saved folder, every data source that runs a command or fetches a URL, so
    that nothing builds a dataset from it (`check_data_sources`); the dotted keys marked."""
    marked = []
    for key in SOURCE_KEYS:
        value = getattr(cfg.data, key)
        if is_remote_source(value) and not value.startswith(WITHHELD):
            setattr(cfg.data, key, WITHHELD + value)
            marked.append(f"data.{key}")
    return marked


def check_data_sources(cfg: Config) -> None:
    """Refuse, in one sentence, a data source withheld from a saved config (see `withhold_remote_sources`)."""
    for key in SOURCE_KEYS:
        value = getattr(cfg.data, key)
        if isinstance(value, str) and value.startswith(WITHHELD):
            given = value[len(WITHHELD):]
            raise ConfigError(f"data.{key} {given!r} comes from a saved config (a checkpoint's config.yaml), and a "
                              "command or remote data source from a saved config is never run or fetched; if you "
                              f"trust it, pass it yourself: --data.{key}='{given}' on evaluate.py's command line "
                              f"(export.py: verify on --images), or set cfg.data.{key} in Python.")

