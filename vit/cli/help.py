"""`--help` for every script, answered before torch is imported.

The scripts build their argparse parsers before their heavy imports and call `exit_if_help` first, so
`python evaluate.py --help` prints in well under a second instead of after ~7 s of torch/timm imports. train.py has
no argparse options of its own: its help is the config schema, read from the dataclasses in vit/config/schema.py (key,
type, default) and from the comment written beside each field, so the help cannot drift from the code:
tests/test_cli_help.py fails when a field has no comment.

This module imports only the standard library, PyYAML and vit.config (itself light).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import io
import shutil
import sys
import textwrap
import tokenize
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["AUG_EPILOG", "CROP_HINT", "HelpFormatter", "exit_if_help",
           "config_schema", "config_help", "field_comments", "format_value"]

HELP_FLAGS = ("-h", "--help")
# the epilog of every command that takes --aug.* overrides (the evaluation preprocessing): the crop, said once
CROP_HINT = ("A hub model's weights usually centre-crop (crop_pct 0.875 or 0.9): --aug.eval_crop_pct=1.0 keeps the "
             "whole image, border included (inspection images, whose defects may sit at the edge).")
AUG_EPILOG = "Any --aug.* config key may follow (the preprocessing; train.py --help lists them). " + CROP_HINT


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help with the docstring's layout kept and each option's default appended, as
    ArgumentDefaultsHelpFormatter does, but only where there is one to show: a None default is described in the
    option's own help ("default: the checkpoint's"), a store_true flag is off by default, and "(default: None)"
    would be noise."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help = action.help or ""
        d = action.default
        if "%(default)" in help or d is None or d is argparse.SUPPRESS or isinstance(d, bool):
            return help
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            shown = " ".join(map(str, d)) if isinstance(d, list | tuple) else "%(default)s"
            return f"{help} (default: {shown})"
        return help


def exit_if_help(build_parser: Callable[[], argparse.ArgumentParser], argv: Sequence[str] | None = None) -> None:
    """Print the parser's help and exit 0 if -h/--help is among the arguments; otherwise return at once.
    Called at the top of a script, before its heavy imports."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in HELP_FLAGS for a in argv):
        build_parser().print_help()
        sys.exit(0)


def format_value(v: Any) -> str:
    """A value as it would be written in YAML or on the command line: null, true, [0.08, 1.0]."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    return str(v)


def field_comments(cls: type, source: str | None = None) -> dict[str, str]:
    """{field: meaning} for a dataclass defined in vit/config/schema.py: the comment on the field's own line(s),
    or else the block of comment lines directly above it. Fields without either are missing from the result."""
    source = source if source is not None else Path(sys.modules[cls.__module__].__file__).read_text()
    comments: dict[int, str] = {}  # line -> comment text
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.add(tok.start[0])
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    out = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        trailing = [comments[i] for i in range(stmt.lineno, stmt.end_lineno + 1) if i in comments]
        block, line = [], stmt.lineno - 1
        while line in comments and line not in code_lines:
            block.insert(0, comments[line])
            line -= 1
        text = " ".join(trailing or block)
        if text:
            out[stmt.target.id] = text
    return out


def type_text(tp: Any) -> str:
    """A field's resolved type as help shows it: 'int | None', 'choice: a|b' for a Literal."""
    if typing.get_origin(tp) is typing.Literal:
        return "choice: " + "|".join(format_value(c) if c != "" else "''" for c in typing.get_args(tp) if c is not None)
    if tp is type(None):
        return "None"
    args = typing.get_args(tp)
    if args and typing.get_origin(tp) in (typing.Union, type(int | None)):
        return " | ".join(type_text(a) for a in args)
    return getattr(tp, "__name__", str(tp)) if not args else str(tp).replace("typing.", "")


def config_schema() -> list[dict[str, Any]]:
    """One row per config key, in the dataclasses' order: section, key, type, default, meaning."""
    from .. import config as C  # here, not at the top: predict.py --onnx builds its parser without PyYAML

    rows = []
    for section in dataclasses.fields(C.Config):
        cls = section.default_factory  # every section is a dataclass built by default_factory
        meanings = field_comments(cls)
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            key = f"{section.name}.{f.name}"
            tp = type_text(typing.get_type_hints(cls)[f.name])
            if key in C.CHOICES and "choice" not in tp:  # a str key whose choices are a table, not its type
                tp += ": " + "|".join(format_value(c) for c in C.CHOICES[key] if c is not None)
            rows.append(dict(section=section.name, key=key, type=tp, default=default, meaning=meanings.get(f.name, "")))
            rows += _option_rows(section.name, key, typing.get_type_hints(cls)[f.name])
    return rows


def _option_rows(section: str, key: str, tp: Any) -> list[dict[str, Any]]:
    """The rows of an options object's fields (`model.sparse_attention.density`) under a `SomeOptions | None` key."""
    options = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
    if not options:
        return []
    meanings, rows, hints = field_comments(options[0]), [], typing.get_type_hints(options[0])
    for f in dataclasses.fields(options[0]):
        default = "(required)" if f.default is dataclasses.MISSING else f.default
        tp = type_text(hints[f.name])
        rows.append(dict(section=section, key=f"{key}.{f.name}", type=tp, default=default,
                         meaning=meanings.get(f.name, "")))
    return rows


def config_help(config_path: str | Path | None = "configs/default.yaml") -> str:
    """The schema as text, grouped by section; where the config file sets a key to another value than the
    dataclass default, that value is shown too (it is what a run without overrides uses)."""
    from .. import config as C  # here, not at the top: predict.py --onnx builds its parser without PyYAML

    file_values: dict[str, Any] = {}
    if config_path and Path(config_path).is_file():
        try:
            data = C.read_yaml(config_path)
            file_values = {f"{s}.{k}": v for s, sec in data.items() if isinstance(sec, dict) for k, v in sec.items()}
        except C.ConfigError:
            pass  # a broken file is reported when the run loads it; help still answers
    width = max(60, min(shutil.get_terminal_size((100, 20)).columns, 120))
    lines = textwrap.wrap(f"Config keys: set them in the --config YAML file or as --section.key=value. Each key "
                          f"shows its default and type; [file: ...] marks what {config_path or 'the config file'} "
                          "sets instead.", width=width)
    if config_path and not Path(config_path).is_file():
        lines += textwrap.wrap(f"The config file {config_path} does not exist, so nothing is marked; pass --config "
                               "with a path to a YAML file (see configs/).", width=width)
    section = None
    for r in config_schema():
        if r["section"] != section:
            section = r["section"]
            lines += ["", f"{section}:"]
        head = f"  {r['key'].split('.', 1)[1]} = {format_value(r['default'])}  ({r['type']})"
        if r["key"] in file_values and file_values[r["key"]] != r["default"]:
            head += f"  [file: {format_value(file_values[r['key']])}]"
        lines.append(head)
        lines += textwrap.wrap(r["meaning"], width=width, initial_indent=" " * 6, subsequent_indent=" " * 6,
                               break_on_hyphens=False)
    return "\n".join(lines) + "\n"


def train_help(doc: str, argv: Sequence[str], default_config: str = "configs/default.yaml") -> str:
    """train.py's help: its docstring, its own flags, then the config schema (with the values of the file that
    --config names, or configs/default.yaml next to train.py)."""
    config = default_config
    for i, a in enumerate(argv):
        if a == "--config" and i + 1 < len(argv):
            config = argv[i + 1]
        elif a.startswith("--config="):
            config = a.split("=", 1)[1]
    flags = ("Options:\n"
             "  --config FILE        the experiment's YAML file (default: configs/default.yaml next to train.py)\n"
             "  --resume[=auto|DIR]  continue a run (same as --run.resume=auto)\n"
             "  --section.key=value  set any config key below, e.g. --optim.lr=3e-4 --run.mixed_precision=no\n")
    return f"{doc.strip()}\n\n{flags}\n{config_help(config)}"
