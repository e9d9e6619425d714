"""Do the maps point at what the model uses? Token deletion and insertion on a checkpoint's held-out images.

The same as `vit faithfulness` (faithfulness.py --help: the options); the code is vit/cli/commands/faithfulness.py.
"""

from vit.cli.commands import faithfulness as _command
from vit.cli.commands.faithfulness import build_parser, main  # noqa: F401 (the script's API)


def __getattr__(name: str):  # the command's other names, for code that imports this script as a module
    return getattr(_command, name)


if __name__ == "__main__":
    from vit.cli.main import run

    run("faithfulness")
