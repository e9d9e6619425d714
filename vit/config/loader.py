"""Reading configs: YAML files through a strict loader (YAML 1.2 booleans, no duplicate keys, no alias bombs),
dotted command-line overrides, and `load_config`, which joins them into a checked `Config`."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError
from .schema import Config
from .strict import from_dict, to_dict


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """['--optim.lr=3e-4', '--run.epochs', '5'] -> {'optim.lr': 0.0003, 'run.epochs': 5}."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or arg == "--":
            raise ConfigError(f"unexpected argument {arg!r}; overrides look like --section.key=value.")
        key = arg[2:]
        if "=" in key:
            key, raw = key.split("=", 1)
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            i += 1
            raw = args[i]
        else:
            raw = "true"  # a bare flag: --run.compile
        try:
            out[key] = yaml.load(raw, Loader=StrictLoader)
        except yaml.YAMLError:
            out[key] = raw
        i += 1
    return out


def apply_overrides(data: dict, overrides: dict[str, Any]) -> dict:
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        if len(parts) < 2 or not all(parts):
            raise ConfigError(f"override '--{dotted}' must look like --section.key (e.g. --optim.lr=3e-4, or "
                              "--model.sparse_attention.density=0.25 inside an options object).")
        section = parts[0]
        if section not in {f.name for f in dataclasses.fields(Config)}:
            raise ConfigError(
                f"unknown config key '{dotted}'; sections are: {', '.join(f.name for f in dataclasses.fields(Config))}."
            )
        node = data
        for i, part in enumerate(parts[:-1]):  # a null options object becomes a mapping to fill
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise ConfigError(f"config key '{'.'.join(parts[:i + 1])}' must be a mapping to set '{dotted}' in, "
                                  f"got {node!r}.")
        node[parts[-1]] = value
    return data


class StrictLoader(yaml.SafeLoader):
    """yaml.safe_load, but a key given twice in one mapping is an error (PyYAML keeps the last one silently), and
    so is a document whose aliases expand to more than MAX_NODES values: a few hundred bytes of nested aliases
    ("billion laughs") become gigabytes the moment anything copies or prints the result."""

    MAX_NODES = 10_000

    def compose_document(self):
        node = super().compose_document()
        _expanded_size(node, {}, self.MAX_NODES)
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    key = self.construct_object(key_node)
                    if key in seen:
                        line = key_node.start_mark.line + 1
                        raise ConfigError(f"key '{key}' appears twice in one mapping (line {line}); keep one of them.")
                    seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.2's booleans: only true/false. PyYAML follows YAML 1.1, where yes/no/on/off (and y/n) are booleans too,
# which would read `--run.mixed_precision=no` (a documented value) as False. Here such words stay strings, and a key
# typed bool takes them back in check_type: `--run.compile=yes` means true.
StrictLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:bool"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _expanded_size(node, memo: dict, limit: int) -> int:
    """Values in the document once every alias is copied out; counted on the node graph, never expanded."""
    if id(node) in memo:
        if memo[id(node)] is None:
            raise ConfigError("the YAML refers to itself through an alias (a recursive structure); remove the alias.")
        return memo[id(node)]
    memo[id(node)] = None
    children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else \
        node.value if isinstance(node, yaml.SequenceNode) else []
    size = 1 + sum(_expanded_size(c, memo, limit) for c in children)
    if size > limit:
        raise ConfigError(f"the YAML's aliases expand to more than {limit} values; write the values out instead.")
    memo[id(node)] = size
    return size


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist; pass --config with a path under configs/.")
    try:
        data = yaml.load(path.read_text(), Loader=StrictLoader)
    except UnicodeDecodeError:
        raise ConfigError(f"config file '{path}' is not UTF-8 text; pass a YAML file.") from None
    except ConfigError as e:
        raise ConfigError(f"config file '{path}': {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file '{path}' is not valid YAML: {str(e).splitlines()[0]}.") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of sections, got {type(data).__name__}.")
    return data or {}


def load_config(path: str | Path | None, overrides: list[str] | dict[str, Any] | None = None) -> Config:
    """The `Config` a YAML file (or the defaults, `path=None`) describes with `overrides` applied: command-line
    strings (`["--optim.lr=3e-4", "--run.epochs", "10"]`) or a {'section.key': value} dict. Loading is strict:
    an unknown key, a wrong type or an out-of-range value raises ConfigError naming the dotted key."""
    data = read_yaml(path) if path else {}
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    return from_dict(apply_overrides(data, overrides or {}))


def dump(cfg: Config) -> str:
    """The config as YAML (the form saved as config.yaml in every checkpoint; `load_config` reads it back)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)

