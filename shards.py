"""Write WebDataset tar shards from an ImageFolder, for `data.dataset: wds`.

The same as `vit shards` (shards.py --help: the options); the code is vit/cli/commands/shards.py.
"""

from vit.cli.commands import shards as _command
from vit.cli.commands.shards import build_parser, main  # noqa: F401 (the script's API)


def __getattr__(name: str):  # the command's other names, for code that imports this script as a module
    return getattr(_command, name)


if __name__ == "__main__":
    from vit.cli.main import run

    run("shards")
