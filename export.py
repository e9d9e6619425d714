"""Export a classifier to ONNX, TorchScript or a torch.export program, checked against PyTorch on real images.

The same as `vit export` (export.py --help: the options); the code is vit/cli/commands/export.py.
"""

from vit.cli.commands.export import EXPORT_FORMATS, build_parser, main, parse_args  # noqa: F401 (the script's API)

if __name__ == "__main__":
    from vit.cli.main import run

    run("export")
