"""Publish a trained checkpoint to the Hugging Face hub: one command, private by default.

The same as `vit publish` (publish.py --help: the options); the code is vit/cli/commands/publish.py.
"""

from vit.cli.commands import publish as _command
from vit.cli.commands.publish import build_parser, main  # noqa: F401 (the script's API)


def __getattr__(name: str):  # the command's other names, for code that imports this script as a module
    return getattr(_command, name)


if __name__ == "__main__":
    from vit.cli.main import run

    run("publish")
