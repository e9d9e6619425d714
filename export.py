"""Export a classifier to ONNX, TorchScript or a torch.export program, checked against PyTorch on real images.

The same as `vit export` (export.py --help: the options); the code is vit/cli/commands/export.py.
"""

from vit.cli.commands import export as _command
from vit.cli.commands.export import EXPORT_FORMATS, build_parser, main, parse_args  # noqa: F401 (the script's API)


def __getattr__(name: str):  # the command's other names, for code that imports this script as a module
    return getattr(_command, name)


if __name__ == "__main__":
    from vit.cli.main import run

    run("export")
