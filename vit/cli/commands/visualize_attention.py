"""See where a trained ViT looks: attention rollout, gradient rollout or one layer's raw attention.

    python visualize_attention.py --checkpoint runs/default/best digits:0-7          # held-out digits
    python visualize_attention.py --checkpoint runs/x/best photos/ "more/*.jpg" --method grad_rollout
    python visualize_attention.py --checkpoint runs/x/best img.png --target-class dog --out attn/
    python visualize_attention.py --checkpoint runs/digits_196/best digits:0-3 --token-reduction merge:16 --show-tokens

Per image it writes <name>_<method>.png (input | heatmap | overlay, a colour bar; the true class when known,
the prediction and the method's settings in the title), <name>_<method>.npy (the raw patch-grid map) and
<name>_<method>.json (method, parameters, top-5, title), by default into attention/ of the checkpoint's run
folder. An image named twice is drawn once; files sharing a name in different folders get <folder>_<name>.
Images go through the checkpoint's own evaluation preprocessing, in batches; headless. A model with token
reduction still gives full-grid maps; --show-tokens also writes <name>_tokens.png (which patches were merged
into one token, or fused away by top-k) and <name>_tokens.npy (the final token of every patch, -1: fused).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    from vit.cli.args import add_model_source
    from vit.cli.help import HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    add_model_source(ap)  # --checkpoint | --model NAME [--pretrained | --weights FILE], --img-size (vit/cli/args.py)
    ap.add_argument("images", nargs="+", help="files, folders, globs, or digits:I[-J] (held-out digits indices)")
    ap.add_argument("--method", choices=("rollout", "grad_rollout", "attention"), default="rollout",
                    help="rollout: attention rollout (Abnar & Zuidema, 2020); grad_rollout: rollout weighted by "
                         "gradients for one class (Chefer et al., 2021); attention: one layer's [CLS] attention")
    ap.add_argument("--head-fusion", choices=("mean", "max", "min"), default="mean",
                    help="rollout and attention: how the heads of a layer are combined")
    ap.add_argument("--discard-ratio", type=float, default=0.0,
                    help="rollout: share of the weakest attention weights set to zero in each layer, in [0, 1)")
    ap.add_argument("--start-layer", type=int, default=0,
                    help="rollout and grad_rollout: first block multiplied in")
    ap.add_argument("--residual-alpha", type=float, default=0.5,
                    help="rollout: weight of the attention against the identity (the residual path), in [0, 1]")
    ap.add_argument("--layer", type=int, default=-1, help="block for --method attention (-1: the last)")
    ap.add_argument("--target-class", default=None, help="class index or name (default: the predicted class)")
    ap.add_argument("--batch-size", type=int, default=16, help="images per forward pass")
    ap.add_argument("--token-reduction", default=None, metavar="SPEC",
                    help="run with token reduction, e.g. merge:16 or topk:0.5@1,2,3 ('none': off; default: the "
                         "checkpoint's setting)")
    ap.add_argument("--show-tokens", action="store_true", help="draw which patches were merged or dropped")
    ap.add_argument("--out", default=None,
                    help="output folder (default: attention/ in the checkpoint's run folder, or "
                         "runs/attention-<checkpoint folder name> for a checkpoint outside a run folder)")
    return ap


def parse_args(argv):
    from vit.cli.args import check_model_source

    args = build_parser().parse_args(argv)
    check_model_source(args)
    if args.out is None:
        args.out = str(default_out(Path(args.checkpoint)) if args.checkpoint
                       else Path("runs") / f"attention-{args.model.replace('/', '_').replace(':', '_')}")
    return args


def default_out(checkpoint: Path) -> Path:
    """attention/ beside the checkpoint in its train.py run folder (runs/<name>/best -> runs/<name>/attention),
    which git ignores with runs/; a checkpoint elsewhere writes runs/attention-<its folder name>."""
    run_dir = checkpoint.absolute().parent
    if (run_dir / "config.yaml").is_file():
        return Path(checkpoint).parent / "attention"
    return Path("runs") / f"attention-{checkpoint.absolute().name}"


def check_options(args, depth: int) -> None:
    """Option values the model can serve, checked before any image is read or file written."""
    from vit.data import DataError

    if not -depth <= args.layer < depth:
        raise DataError(f"--layer {args.layer} does not exist: the model has {depth} blocks (0 to {depth - 1}, "
                        "or -1 for the last).")
    if not 0 <= args.start_layer < depth:
        raise DataError(f"--start-layer {args.start_layer} must be between 0 and {depth - 1} (the model's blocks).")
    if args.batch_size < 1:
        raise DataError(f"--batch-size must be at least 1, got {args.batch_size}.")
    if not 0 <= args.discard_ratio < 1 or not 0 <= args.residual_alpha <= 1:
        raise DataError("--discard-ratio must be in [0, 1) and --residual-alpha in [0, 1].")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise DataError(f"--out {args.out} is an existing file; pass a folder to write the maps into.")


def main(argv=None) -> int:
    from vit.cli.outputs import OutputLock, check_writable

    args = parse_args(sys.argv[1:] if argv is None else argv)
    check_writable(args.out)  # before the model loads or an image is read
    with OutputLock(args.out):  # one visualization per --out at a time
        return _visualize(args)


def _visualize(args) -> int:
    from vit.cli.args import load_model
    from vit.eval.inference import label_names
    from vit.explain.attention_figures import MapOptions, draw_attention
    from vit.explain.attention_inputs import collect_inputs
    from vit.utils.untrusted_text import printable

    model, cfg, classes = load_model(args, {})  # a checkpoint, or a model by name (vit/cli/args.py)
    classes = classes or label_names(model, model.num_classes)
    check_options(args, len(model.blocks))
    if args.token_reduction is not None:
        model.set_token_reduction(args.token_reduction)
    if args.show_tokens and all(b.token_reduction is None for b in model.blocks):
        raise ValueError("--show-tokens needs a model with token reduction; add --token-reduction merge:8 "
                         "(or a checkpoint trained with one).")
    items = collect_inputs(args.images, cfg, classes)
    opts = MapOptions(args.method, args.head_fusion, args.discard_ratio, args.start_layer, args.residual_alpha,
                      args.layer)
    about = dict(checkpoint=args.checkpoint, model=args.model,
                 token_reduction=args.token_reduction or cfg.model.token_reduction)
    done = draw_attention(model, cfg, classes, items, Path(args.out), opts, args.target_class, args.batch_size,
                          args.show_tokens, about)
    for reason in done.skipped:
        print(f"skipping {printable(reason)}", file=sys.stderr)
    written, skipped = len(done.sidecars), len(done.skipped)
    print(f"wrote {written} map(s) to {Path(args.out)}/"
          + (f"; skipped {skipped} unreadable file(s)" if skipped else ""))
    return 0 if written else 2
