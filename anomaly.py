"""Anomaly detection from good parts only (PatchCore): a memory bank of the patch features of good images, each
new image scored by its worst patch's distance to the bank, with a heat map of where.

The same as `vit anomaly` (anomaly.py --help: the options); the code is vit/cli/commands/anomaly.py.
"""

from vit.cli.commands import anomaly as _command
from vit.cli.commands.anomaly import build_parser, main  # noqa: F401 (the script's API)


def __getattr__(name: str):  # the command's other names, for code that imports this script as a module
    return getattr(_command, name)


if __name__ == "__main__":
    from vit.cli.main import run

    run("anomaly")
