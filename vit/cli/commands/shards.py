"""Write WebDataset tar shards from an ImageFolder, for `data.dataset: wds`.

    python shards.py --from data/pets --out data/pets-wds --shard-size 1000

writes `train-00000.tar ...` and `val-00000.tar ...` (each image's original bytes, its class index and file name)
and `_info.json` in the layout timm's `wds/` reader reads, plus the class names; train samples are shuffled
across shards once, shard lengths differ by at most one, unreadable images are left out and named. Nothing is
written when a split folder is missing, a class is unknown or --out already holds shards (see
vit/data/shards.py). Then train with --data.dataset=wds --data.root=data/pets-wds.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    from vit.cli.help import HelpFormatter

    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--from", dest="src", required=True, help="ImageFolder with train/ and val/ (<split>/<class>/*)")
    p.add_argument("--out", required=True, help="folder for the shards and _info.json")
    p.add_argument("--shard-size", type=int, default=1000, help="samples per shard at most")
    p.add_argument("--splits", default="train,val", help="comma-separated split folders")
    p.add_argument("--seed", type=int, default=0, help="seed of the one-time shuffle of train samples")
    p.add_argument("--overwrite", action="store_true", help="replace shards already in --out")
    return p


def main(argv: list[str] | None = None) -> int:
    from vit.data.shards import INFO_NAME, write_shards

    a = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    info = write_shards(a.src, a.out, a.shard_size, tuple(s for s in a.splits.split(",") if s), a.seed, a.overwrite)
    for name, s in info["splits"].items():
        print(f"{name}: {s['num_samples']} samples in {len(s['filenames'])} shards"
              + (f", {s['num_bad']} unreadable left out" if s["num_bad"] else ""))
    print(f"wrote {Path(a.out) / INFO_NAME} ({len(info['classes'])} classes)")
    return 0

