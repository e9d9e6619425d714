"""Do the maps point at what the model uses? Token deletion and insertion on a checkpoint's held-out images.

    python faithfulness.py --checkpoint runs/default/best [--limit 360] [--out DIR]

For every held-out image and every map (attention rollout, gradient rollout, last-layer raw attention, a random
map) patch tokens are removed from the sequence most relevant first (deletion) or added back in that order
(insertion); the score is the area under the curve of the predicted class's probability, with paired bootstrap
95% intervals (see vit/explain/faithfulness.py). Writes faithfulness.json and faithfulness_curves.png to --out
(default: <checkpoint>/faithfulness) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    from vit.cli.help import HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="a checkpoint folder written by train.py (best/ or last/)")
    ap.add_argument("--limit", type=int, default=None, help="use the first N held-out images (default: all)")
    ap.add_argument("--batch-size", type=int, default=64, help="images per forward pass")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random map and the bootstrap")
    ap.add_argument("--out", default=None, help="output folder (default: <checkpoint>/faithfulness)")
    return ap


def main(argv: list[str] | None = None) -> int:
    import torch

    from vit.data import build_datasets
    from vit.explain.faithfulness import evaluate_faithfulness, format_table, plot
    from vit.models.checkpoint import load_checkpoint
    from vit.utils.atomic import atomic_write_text

    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    model, cfg, classes, _ = load_checkpoint(args.checkpoint)
    _, val, _ = build_datasets(cfg, splits=("val",), classes=classes)
    n = min(len(val), args.limit or len(val))
    images = torch.stack([val[i][0] for i in range(n)])
    torch.manual_seed(args.seed)
    result = evaluate_faithfulness(model, images, args.batch_size, args.seed)
    out = Path(args.out) if args.out else Path(args.checkpoint) / "faithfulness"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "faithfulness.json", json.dumps(result, indent=1))
    plot(result, out / "faithfulness_curves.png")
    print(f"{n} held-out images, {model.patch_embed.num_patches} patch tokens each\n")
    print(format_table(result))
    print(f"\nwrote {out}/faithfulness.json and faithfulness_curves.png")
    return 0

