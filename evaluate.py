"""Evaluate a checkpoint: accuracy, per-class precision/recall/F1, calibration, and the images it gets wrong.

The same as `vit evaluate` (evaluate.py --help: the options); the code is vit/cli/commands/evaluate.py.
"""

from vit.cli.commands import evaluate as _command
from vit.cli.commands.evaluate import build_parser, main, parse_args  # noqa: F401 (the script's API)


def __getattr__(name: str):  # the command's other names, for code that imports this script as a module
    return getattr(_command, name)


if __name__ == "__main__":
    from vit.cli.main import run

    run("evaluate")
