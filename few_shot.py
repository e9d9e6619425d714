"""A few-shot table in one command: N labelled images per class (--shots), several seeds, each way of using a
backbone (k-NN and linear probe on frozen features, LoRA, full fine-tuning), on the same sampled images.

The same as `vit few-shot` (few_shot.py --help: the options); the code is vit/cli/commands/few_shot.py.
"""

from vit.cli.commands.few_shot import build_parser, main  # noqa: F401 (the script's API)

if __name__ == "__main__":
    from vit.cli.main import run

    run("few-shot")
