"""A local demo page for a trained checkpoint: drop an image, see the top-5 and the attention-rollout overlay.

The same as `vit demo` (demo.py --help: the options); the code is vit/cli/commands/demo.py.
"""

from vit.cli.commands.demo import build_parser, main  # noqa: F401 (the script's API)

if __name__ == "__main__":
    from vit.cli.main import run

    run("demo")
