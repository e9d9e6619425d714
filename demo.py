"""A local demo page for a trained checkpoint: drop an image, see the top-5 and the attention-rollout overlay.

The same as `vit demo` (demo.py --help: the options); the code is vit/cli/commands/demo.py.
"""

from vit.cli.commands import demo as _command
from vit.cli.commands.demo import build_parser, main  # noqa: F401 (the script's API)


def __getattr__(name: str):  # the command's other names, for code that imports this script as a module
    return getattr(_command, name)


if __name__ == "__main__":
    from vit.cli.main import run

    run("demo")
