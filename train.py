"""Train a Vision Transformer with Accelerate: one CPU, one GPU or many, without edits.

    accelerate launch train.py                                   # configs/default.yaml: digits, offline
    accelerate launch --multi_gpu --num_processes 2 train.py     # two processes (gloo on a CPU-only machine)

The same as `vit train`; the code is vit/cli/commands/train.py (`python train.py --help` lists every config key).
"""

from vit.cli.commands import train as _command
from vit.cli.commands.train import DEFAULT_CONFIG, main, parse_args  # noqa: F401 (the script's API)


def __getattr__(name: str):  # the command's other names, for code that imports this script as a module
    return getattr(_command, name)


if __name__ == "__main__":
    from vit.cli.main import run

    run("train")
