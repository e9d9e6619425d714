"""Write each image's frozen features: the pooled embedding the head reads and, with --patch-tokens, the final
patch tokens, for any model evaluate.py and predict.py take, in input order with the image paths.

The same as `vit features` (features.py --help: the options); the code is vit/cli/commands/features.py.
"""

from vit.cli.commands import features as _command
from vit.cli.commands.features import build_parser, main  # noqa: F401 (the script's API)


def __getattr__(name: str):  # the command's other names, for code that imports this script as a module
    return getattr(_command, name)


if __name__ == "__main__":
    from vit.cli.main import run

    run("features")
