"""Images/s of the shard reader against the folder reader: the same small JPEGs, one loader worker each.

    PYTHONPATH=. python scripts/bench_shards.py --images 2000 --repeats 5

Generates an ImageFolder of photo-like JPEGs (vit.data.synthetic.photo_like, `--width` x `--height`, quality 90), writes
its shards with `vit.data.shards.write_shards`, then times full passes over the train split, alternating folder and
shards: the folder dataset (FolderDataset + EpochSampler in a DataLoader) and the shard loader (ShardLoader),
both with one worker, batch 64, our training pipeline at 224 px (random resized crop, flip). Prints the median
images/s of each and the median of the per-pair ratios shards / folder, with its min-max.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

from vit.config import AugConfig
from vit.data import EpochSampler, FolderDataset
from vit.data.shard_loader import ShardDataset, ShardLoader
from vit.data.shards import resolve_split, write_shards
from vit.data.synthetic import photo_like
from vit.data.transforms import build_transform
from vit.utils.timing import interleaved, ratio_stats


def make_folder(root: Path, n: int, width: int, height: int, classes: int = 10) -> None:
    rng = np.random.default_rng(0)
    for split, count in (("train", n), ("val", classes)):
        for i in range(count):
            d = root / split / f"c{i % classes}"
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(photo_like(rng, width, height)).save(d / f"{i:05d}.jpg", quality=90)


def epochs(loader, set_epoch, images: list[int]):
    """One full pass over `loader` per call, the images it gave appended to `images`; the first call (the warm-up:
    page cache, worker start-up code paths) at the loader's own epoch, call r + 1 at epoch r."""
    calls = [0]

    def one_pass():
        if calls[0]:
            set_epoch(calls[0] - 1)
        calls[0] += 1
        images.append(sum(x.shape[0] for x, _ in loader))
    return one_pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--width", type=int, default=160)
    ap.add_argument("--height", type=int, default=120)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--shard-size", type=int, default=1000)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    t = build_transform(AugConfig(random_resized_crop=True, hflip=0.5), 224, True)
    with tempfile.TemporaryDirectory(prefix="vit-bench-shards-") as tmp:
        root, out = Path(tmp) / "folder", Path(tmp) / "shards"
        make_folder(root, a.images, a.width, a.height)
        info = write_shards(root, out, a.shard_size)
        kb = sum(p.stat().st_size for p in (root / "train").rglob("*.jpg")) / a.images / 1024
        print(f"{a.images} JPEGs of {a.width}x{a.height} (~{kb:.1f} KB each), "
              f"{len(info['splits']['train']['filenames'])} shards; one worker, batch {a.batch_size}, 224 px")
        folder_ds = FolderDataset(root / "train", info["classes"], t)
        folder = DataLoader(folder_ds, batch_size=a.batch_size, sampler=EpochSampler(len(folder_ds)), num_workers=1)
        shard_ds = ShardDataset(resolve_split(str(out), "train"), info["classes"], t, train=True,
                                shuffle_buffer=a.shard_size)
        shards = ShardLoader(shard_ds, a.batch_size, num_workers=1, rank=0, world=1)
        images: dict[str, list[int]] = {"folder": [], "shards": []}
        seconds = interleaved({"folder": epochs(folder, folder_ds.set_epoch, images["folder"]),
                               "shards": epochs(shards, shards.set_epoch, images["shards"])},
                              warmup=1, repeats=a.repeats).wall  # folder, shards, folder, shards, ...
    res = {k: [n / t for n, t in zip(images[k][1:], v)] for k, v in seconds.items()}  # images/s per pass
    r = ratio_stats(res["folder"], res["shards"])
    for k, v in res.items():
        print(f"{k:7s} {statistics.median(v):8.0f} images/s (median of {len(v)}: {', '.join(f'{x:.0f}' for x in v)})")
    print(f"shards / folder: {r['median']:.2f}x (min {r['min']:.2f}, max {r['max']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
