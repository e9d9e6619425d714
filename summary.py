"""Trace the data's path through a model: each stage's output shape, parameters and FLOPs.

The same as `vit summary` (summary.py --help: the options); the code is vit/cli/commands/summary.py.
"""

from vit.cli.commands import summary as _command
from vit.cli.commands.summary import build_parser, main  # noqa: F401 (the script's API)


def __getattr__(name: str):  # the command's other names, for code that imports this script as a module
    return getattr(_command, name)


if __name__ == "__main__":
    from vit.cli.main import run

    run("summary")
