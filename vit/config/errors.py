"""The error every bad config raises, and the one an options object raises (named by its field)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad config: the message names the key and says what is wrong."""


class OptionError(ConfigError):
    """A bad value in an options object: `key` is the field, `problem` the rest of the sentence, so that a config
    names it by its dotted key ('model.sparse_attention.density') and Python by the object ('SparseOptions')."""

    def __init__(self, owner: str, key: str, problem: str) -> None:
        self.key, self.problem = key, problem
        super().__init__(f"{owner} option '{key}' {problem}")
