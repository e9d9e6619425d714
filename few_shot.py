"""A few-shot table in one command: N labelled images per class (--shots), several seeds, each way of using a
backbone (k-NN and linear probe on frozen features, LoRA, full fine-tuning), on the same sampled images.

The same as `vit few-shot` (few_shot.py --help: the options); the code is vit/cli/commands/few_shot.py.
"""

from vit.cli.commands import few_shot as _command
from vit.cli.commands.few_shot import build_parser, main  # noqa: F401 (the script's API)


def __getattr__(name: str):  # the command's other names, for code that imports this script as a module
    return getattr(_command, name)


if __name__ == "__main__":
    from vit.cli.main import run

    run("few-shot")
