"""The commands of `vit` (and of the root scripts, which are shims over them): one module per command, each
with `build_parser()` and `main(argv) -> int`, imported only when its command runs, as `hf`, `accelerate` and
`anomalib` install theirs. `COMMANDS` is the one list: `vit --help` prints it, README.md's list is checked against
it (tests/test_cli_command.py). Standard library only: `vit --help` and `vit <command> --help` load no torch."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["COMMANDS", "Command", "find_command"]


class Command(NamedTuple):
    name: str  # what follows `vit` on the command line
    module: str  # the module holding build_parser() and main(argv)
    help: str  # one line for `vit --help`
    script: str  # the root script that is a shim over it


def _command(name: str, help: str) -> Command:
    stem = name.replace("-", "_")
    return Command(name, f"vit.cli.commands.{stem}", help, f"{stem}.py")


COMMANDS: tuple[Command, ...] = (
    _command("train", "train a model from a YAML config (accelerate launch train.py for several processes)"),
    _command("evaluate", "score a checkpoint or a model by name: accuracy, per-class metrics, calibration"),
    _command("predict", "label images: top-k classes per image, from a checkpoint, a model by name or ONNX"),
    _command("export", "export to ONNX, TorchScript or a torch.export program, checked against PyTorch"),
    _command("visualize-attention", "draw where a model looks: attention rollout, gradient rollout, raw maps"),
    _command("faithfulness", "check attention maps by deleting and inserting tokens"),
    _command("features", "write each image's frozen features (pooled embedding, patch tokens)"),
    _command("probe", "k-NN or linear probe on a features file"),
    _command("few-shot", "a few-shot table: k-NN, linear probe, LoRA and fine-tuning on N images per class"),
    _command("anomaly", "anomaly detection from good parts only (PatchCore): fit, then score"),
    _command("demo", "a local demo page: drop an image, see the top-5 and the attention overlay"),
    _command("publish", "publish a checkpoint to the Hugging Face hub"),
    _command("summary", "each stage's output shape, parameters and FLOPs for a model by name"),
    _command("shards", "write WebDataset tar shards from an ImageFolder"),
    _command("benchmark", "speed and memory of our ViT against timm's, measured side by side"),
)


def find_command(name: str) -> Command | None:
    """The command called `name` (a script's stem, `few_shot`, is taken too); None when there is none."""
    for c in COMMANDS:
        if name in (c.name, c.name.replace("-", "_")):
            return c
    return None
