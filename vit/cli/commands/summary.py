"""Trace the data's path through a model: each stage's output shape, parameters and FLOPs.

    python summary.py vit_base_patch16_224 [--img-size 224] [--batch-size 1] [--num-classes 1000]

FLOPs are counted by PyTorch's `FlopCounterMode` with CPU flash attention added and attributed to the module
that ran them; a multiply-add counts as 2 FLOPs, so they are twice the "GMACs" of timm's tables
(vit/models/summary.py).
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from vit.cli.help import HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("model", help="a model name, e.g. vit_small_patch16_224")
    ap.add_argument("--img-size", type=int, default=None, help="input size (default: the variant's)")
    ap.add_argument("--batch-size", type=int, default=1, help="images in the traced batch")
    ap.add_argument("--num-classes", type=int, default=None, help="classes of the head (default: the variant's)")
    return ap


def main(argv: list[str] | None = None) -> None:
    import torch

    from vit.models.build import create_model
    from vit.models.summary import format_summary, summarize

    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    overrides = {k: v for k, v in (("img_size", args.img_size), ("num_classes", args.num_classes)) if v}
    try:
        model = create_model(args.model, **overrides).eval()
    except (ValueError, TypeError) as e:
        raise SystemExit(f"error: {e}") from None
    h, w = model.patch_embed.img_size
    x = torch.randn(args.batch_size, model.patch_embed.proj.in_channels, h, w)
    print(f"{args.model}: patch {model.patch_embed.patch_size}, grid {model.patch_embed.grid_size}, "
          f"{model.num_prefix_tokens + model.patch_embed.num_patches} tokens of width {model.embed_dim}")
    print(format_summary(summarize(model, x)))



def run(argv: list[str]) -> int:
    """summary.py as a process: --help before torch loads, then main (a Python error shows its traceback)."""
    from vit.cli.help import exit_if_help

    exit_if_help(build_parser, argv)
    main(argv)
    return 0
