"""`vit`, the installed command (pyproject.toml's [project.scripts]; `python -m vit` too): `vit <command> ...`
runs one of vit.cli.commands.COMMANDS exactly as its root script does (`vit evaluate ...` is `python evaluate.py
...`: same options, output and exit codes). `vit --help` reads only the registry; `vit <command> --help` imports
only the command's parser. Standard library only until a command runs."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from .commands import COMMANDS, find_command
from .help import exit_if_help

__all__ = ["main", "run", "usage"]


def usage() -> str:
    """`vit --help`: every command with its line of help, from the registry."""
    width = max(len(c.name) for c in COMMANDS) + 2
    lines = ["usage: vit <command> [options]   (vit <command> --help: that command's options)", "",
             "A Vision Transformer toolkit: train, evaluate, predict, export and inspect timm-compatible ViTs.", "",
             "commands:"]
    lines += [f"  {c.name:<{width}}{c.help}" for c in COMMANDS]
    lines += ["", "Each command is also a script in the repository (vit evaluate ... is python evaluate.py ...)."]
    return "\n".join(lines) + "\n"


def run(name: str, argv: Sequence[str] | None = None) -> NoReturn:
    """Run the command `name` as this process and exit with its code: --help before the command's heavy imports,
    then its main under run_cli (a user's mistake: one line, exit 2; Ctrl-C: 130; SIGTERM: 143). A command with a
    start of its own (train's help and early SIGTERM handler, predict --onnx without torch) defines `run(argv)`."""
    module = importlib.import_module(find_command(name).module)
    argv = list(sys.argv[1:] if argv is None else argv)
    if hasattr(module, "run"):
        sys.exit(module.run(argv))
    exit_if_help(module.build_parser, argv)
    from .runtime import run_cli  # torch from here on

    run_cli(lambda: module.main(argv), getattr(module, "interrupt_note", None))


def main(argv: Sequence[str] | None = None) -> NoReturn:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), end="")
        sys.exit(0 if argv else 2)
    command = find_command(argv[0])
    if command is None:
        names = ", ".join(c.name for c in COMMANDS)
        print(f"error: vit has no command {argv[0]!r}; the commands are {names} (vit --help).", file=sys.stderr)
        sys.exit(2)
    sys.argv = [f"vit {command.name}", *argv[1:]]  # argparse's usage lines and errors name `vit evaluate`
    run(command.name, argv[1:])
