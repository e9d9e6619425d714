"""See where a trained ViT looks: attention rollout, gradient rollout or one layer's raw attention.

The same as `vit visualize-attention` (visualize_attention.py --help: the options); the code is
vit/cli/commands/visualize_attention.py.
"""

from vit.cli.commands import visualize_attention as _command
from vit.cli.commands.visualize_attention import build_parser, check_options, main, parse_args  # noqa: F401 (its API)


def __getattr__(name: str):  # the command's other names, for code that imports this script as a module
    return getattr(_command, name)


if __name__ == "__main__":
    from vit.cli.main import run

    run("visualize-attention")
