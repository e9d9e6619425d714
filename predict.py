"""Label images that have no labels: top-k classes and probabilities per image, in input order.

The same as `vit predict` (predict.py --help: the options); the code is vit/cli/commands/predict.py.
"""

from vit.cli.commands import predict as _command
from vit.cli.commands.predict import build_parser, main, parse_args, run_onnx  # noqa: F401 (the script's API)


def __getattr__(name: str):  # the command's other names, for code that imports this script as a module
    return getattr(_command, name)


if __name__ == "__main__":
    from vit.cli.main import run

    run("predict")
