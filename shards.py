"""Write WebDataset tar shards from an ImageFolder, for `data.dataset: wds`.

The same as `vit shards` (shards.py --help: the options); the code is vit/cli/commands/shards.py.
"""

from vit.cli.commands.shards import build_parser, main  # noqa: F401 (the script's API)

if __name__ == "__main__":
    from vit.cli.main import run

    run("shards")
