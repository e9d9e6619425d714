"""Do the maps point at what the model uses? Token deletion and insertion on a checkpoint's held-out images.

The same as `vit faithfulness` (faithfulness.py --help: the options); the code is vit/cli/commands/faithfulness.py.
"""

from vit.cli.commands.faithfulness import build_parser, main  # noqa: F401 (the script's API)

if __name__ == "__main__":
    from vit.cli.main import run

    run("faithfulness")
