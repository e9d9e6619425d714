"""A few-shot table in one command: N labelled images per class (--shots), several seeds, each way of using a
backbone (k-NN and linear probe on frozen features, LoRA, full fine-tuning), on the same sampled images.

    python few_shot.py --checkpoint runs/digits04/best --train data/new/train --test data/new/test --out fewshot/
    python few_shot.py --checkpoint runs/x/best --train a/ --test b/ --shots 1 5 10 0 --methods knn linear
    python few_shot.py --model vit_small_patch16_224.augreg_in21k --train a/ --test b/ --methods knn linear

The backbone is any model features.py and anomaly.py take: a train.py checkpoint folder, or --model NAME with
its weights by name (hub cache, local-dir:/folder, hf-hub:org/repo) or those of a --weights file.

--train and --test are folders of <class>/ image folders (their classes need not be the backbone's: a new head
is trained). --shots 0 means every training image. Writes to --out: few_shot.csv (one row per method, N, seed),
summary.csv (mean and standard deviation over the seeds) and few_shot.png; prints the summary. Small data only:
the images are held in memory and fine-tuning is full-batch. LoRA and full fine-tuning follow the project's
recipe (configs/default.yaml: AdamW, warmup and cosine, clipping) with the backbone's own affine augmentation,
horizontal flip and label smoothing (not its random resized crop or colour jitter).
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from vit.cli.args import add_model_source
    from vit.cli.help import CROP_HINT, HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter,
                                 usage="%(prog)s (--checkpoint DIR | --model NAME ...) --train DIR --test DIR ...",
                                 epilog="Any --aug.* config key may follow (the preprocessing and the fine-tuning's "
                                        "augmentation; train.py --help lists them). " + CROP_HINT)
    add_model_source(ap)  # --checkpoint | --model NAME [--pretrained | --weights FILE], --img-size (vit/cli/args.py)
    ap.add_argument("--train", required=True, help="the labelled pool: a folder of <class>/ folders")
    ap.add_argument("--test", required=True, help="the images scored: a folder of <class>/ folders")
    ap.add_argument("--shots", type=int, nargs="+", default=[1, 5, 10], help="labelled images per class (0: all)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one sample per seed")
    ap.add_argument("--methods", nargs="+", default=["knn", "linear", "lora", "full"],
                    choices=("knn", "linear", "lora", "full"), help="which methods")
    ap.add_argument("--features", nargs="+", default=["pooled"], choices=("pooled", "patches"),
                    help="knn/linear: the pooled embedding the head reads, the final patch tokens (flattened in grid "
                         "order; they keep where things are), or both (one row each)")
    ap.add_argument("--steps", type=int, default=600,
                    help="lora/full: full-batch AdamW steps (epochs); LoRA needs more than full fine-tuning does")
    ap.add_argument("--lr", type=float, default=1e-3, help="full: peak learning rate")
    ap.add_argument("--layer-decay", type=float, default=0.0, help="full: layer-wise lr decay (0: none)")
    ap.add_argument("--lr-lora", type=float, default=1e-2, help="lora: learning rate")
    ap.add_argument("--lora-rank", type=int, default=4, help="lora: adapter rank")
    ap.add_argument("--out", default="few-shot", help="output folder")
    return ap


def load_folder(folder: str, transform, in_chans: int, classes: list[str] | None = None):
    """(images (N, C, S, S), labels (N,) indices into the class list, class list) of a <class>/ folder tree."""
    import numpy as np
    import torch

    from vit.cli.images import collect_images
    from vit.data import DataError
    from vit.eval.inference import ImageFiles

    paths, _ = collect_images([folder])
    if not paths:
        raise DataError(f"no images in {folder}; pass a folder of <class>/ image folders.")
    classes = classes or sorted({p.parent.name for p in paths})
    unseen = sorted({p.parent.name for p in paths} - set(classes))
    if unseen:
        raise DataError(f"{folder} has class {unseen[0]!r}, which --train has not; give both the same classes.")
    ds = ImageFiles(paths, transform, in_chans)
    items = [ds[i] for i in range(len(ds))]
    bad = [str(paths[i]) for i, it in enumerate(items) if not it[1]]
    if bad:
        raise DataError(f"{bad[0]} could not be read as an image; remove it or replace it.")
    labels = np.array([classes.index(p.parent.name) for p in paths], dtype=np.int64)
    return torch.stack([it[0] for it in items]), labels, classes


def check_numbers(args: argparse.Namespace) -> None:
    """The counts and rates: one sentence naming the first that is wrong (NaN fails every comparison here)."""
    from vit.config import ConfigError

    for name, values in (("--shots", args.shots), ("--seeds", args.seeds)):
        if min(values) < 0 or len(set(values)) < len(values):
            raise ConfigError(f"{name} must be distinct numbers of 0 or more, got {' '.join(map(str, values))}.")
    for name, value in (("--steps", args.steps), ("--lora-rank", args.lora_rank)):
        if value < 1:
            raise ConfigError(f"{name} must be at least 1, got {value}.")
    for name, value in (("--lr", args.lr), ("--lr-lora", args.lr_lora)):
        if not 0 < value < float("inf"):
            raise ConfigError(f"{name} must be a finite number above 0, got {value}.")
    if not 0 <= args.layer_decay <= 1:
        raise ConfigError(f"--layer-decay must be in [0, 1] (0: none), got {args.layer_decay}.")


def check_classes(args: argparse.Namespace, classes: list[str], train_y) -> None:
    """Two classes at least (one scores 100% with every method), and no more shots than the smallest class has
    (the table would say N shots where a class gave fewer)."""
    import numpy as np

    from vit.config import ConfigError

    if len(classes) < 2:
        raise ConfigError(f"{args.train} has one class ({classes[0]!r}); a few-shot table needs two or more class "
                          "folders, in --train and --test alike.")
    counts = np.bincount(train_y, minlength=len(classes))
    if max(args.shots) > counts.min():
        raise ConfigError(f"--shots {max(args.shots)} is more than the {counts.min()} image(s) of class "
                          f"{classes[counts.argmin()]!r} in {args.train}; give at most {counts.min()}, or 0 for all.")


def main(argv=None) -> int:
    import dataclasses
    from pathlib import Path

    from vit.cli.args import load_model, parse_command
    from vit.cli.outputs import check_writable
    from vit.config import ConfigError
    from vit.data.transforms import build_transform
    from vit.eval.plots import plot_few_shot
    from vit.train.few_shot import FINETUNE, few_shot_rows, summarize
    from vit.utils.atomic import atomic_write_csv

    args, overrides = parse_command(build_parser(), sys.argv[1:] if argv is None else argv, "few_shot.py", ("aug.",),
                                    ("img_size",))
    check_numbers(args)
    out = Path(args.out)
    check_writable(out)
    model, cfg, _ = load_model(args, overrides)
    if cfg.data.naflex is not None:  # its images would be squashed to one square size, unlike in its training
        raise ConfigError("few_shot.py holds the images as one batch of square tensors, and this checkpoint reads each "
                          "image at its own aspect ratio (data.naflex); take its k-NN and linear rows from features.py "
                          "(which honours it) and probe.py.")
    transform = build_transform(cfg.aug, cfg.model.img_size, train=False)
    train_x, train_y, classes = load_folder(args.train, transform, cfg.model.in_chans)
    test_x, test_y, _ = load_folder(args.test, transform, cfg.model.in_chans, classes)
    check_classes(args, classes, train_y)
    optim = dataclasses.replace(FINETUNE, lr=args.lr, layer_decay=args.layer_decay or None)
    rows = few_shot_rows(model, train_x, train_y, test_x, test_y, tuple(args.shots), tuple(args.seeds),
                         tuple(args.methods), optim, cfg.aug, args.steps, args.lora_rank, args.lr_lora,
                         features=tuple(dict.fromkeys(args.features)))
    table = summarize(rows)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_csv(out / "few_shot.csv", list(rows[0]), rows)
    atomic_write_csv(out / "summary.csv", list(table[0]), table)
    plot_few_shot(table, out / "few_shot.png")
    print(f"{len(classes)} classes, {len(test_y)} test images, seeds {args.seeds}")
    print(f"{'method':>14s} {'N':>4s}  top-1 (mean +- std)")
    for r in table:
        print(f"{r['method']:>14s} {r['shots'] or 'all':>4}  {100 * r['mean']:6.2f} +- {100 * r['std']:.2f}")
    share = {r["method"]: r["trained_share"] for r in rows if r["trained_share"]}
    if share:
        print("trained share: " + ", ".join(f"{m} {100 * s:.2f}%" for m, s in share.items()))
    print(f"wrote {out}/few_shot.csv, summary.csv, few_shot.png")
    return 0

