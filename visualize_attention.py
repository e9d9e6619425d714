"""See where a trained ViT looks: attention rollout, gradient rollout or one layer's raw attention.

The same as `vit visualize-attention` (visualize_attention.py --help: the options); the code is
vit/cli/commands/visualize_attention.py.
"""

from vit.cli.commands.visualize_attention import build_parser, check_options, main, parse_args  # noqa: F401 (its API)

if __name__ == "__main__":
    from vit.cli.main import run

    run("visualize-attention")
