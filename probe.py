"""Evaluate a frozen backbone from its features: weighted k-NN (DINO's protocol) or a linear probe (logistic
regression, its C chosen on a validation split), reported as evaluate.py reports a model.

The same as `vit probe` (probe.py --help: the options); the code is vit/cli/commands/probe.py.
"""

from vit.cli.commands import probe as _command
from vit.cli.commands.probe import build_parser, main  # noqa: F401 (the script's API)


def __getattr__(name: str):  # the command's other names, for code that imports this script as a module
    return getattr(_command, name)


if __name__ == "__main__":
    from vit.cli.main import run

    run("probe")
