"""Speed and memory of our ViT against timm's same-named model, measured side by side in one run.

The same as `vit benchmark` (benchmark.py --help: the options); the code is vit/cli/commands/benchmark.py.
"""

from vit.cli.commands import benchmark as _command
from vit.cli.commands.benchmark import build_parser, main  # noqa: F401 (the script's API)


def __getattr__(name: str):  # the command's other names, for code that imports this script as a module
    return getattr(_command, name)


if __name__ == "__main__":
    from vit.cli.main import run

    run("benchmark")
