"""See where a trained ViT looks: attention rollout, gradient rollout or one layer's raw attention.

    python visualize_attention.py --checkpoint runs/default/best digits:0-7          # held-out digits
    python visualize_attention.py --checkpoint runs/x/best photos/ "more/*.jpg" --method grad_rollout
    python visualize_attention.py --checkpoint runs/x/best img.png --target-class dog --out attn/

Per image it writes <name>_<method>.png (input | heatmap | overlay; predicted class and probability in the
title), <name>_<method>.npy (the raw patch-grid map) and <name>_<method>.json (method, parameters, top-5).
Images go through the checkpoint's own evaluation preprocessing, in batches; headless.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import sys
from pathlib import Path

import numpy as np
import torch

from vit.checkpoint import atomic_write_bytes, atomic_write_text, load_checkpoint
from vit.data import IMG_EXTENSIONS, DataError, build_datasets
from vit.plots import plot_attention_map, to_display
from vit.rollout import attention_maps
from vit.runtime import run_cli
from vit.transforms import BadImageError, build_transform


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True, help="a checkpoint folder written by train.py")
    ap.add_argument("images", nargs="+", help="files, folders, globs, or digits:I[-J] (held-out digits indices)")
    ap.add_argument("--method", choices=("rollout", "grad_rollout", "attention"), default="rollout")
    ap.add_argument("--head-fusion", choices=("mean", "max", "min"), default="mean")
    ap.add_argument("--discard-ratio", type=float, default=0.0)
    ap.add_argument("--start-layer", type=int, default=0)
    ap.add_argument("--residual-alpha", type=float, default=0.5)
    ap.add_argument("--layer", type=int, default=-1, help="layer for --method attention")
    ap.add_argument("--target-class", default=None, help="class index or name (default: the predicted class)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", default="attention_maps")
    return ap.parse_args(argv)


def check_options(args, depth: int) -> None:
    """Option values the model can serve, checked before any image is read or file written."""
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


def collect_inputs(specs: list[str], cfg) -> list[tuple[str, np.ndarray | Path]]:
    """(name, image array or path) for every requested image, in order."""
    items: list[tuple[str, np.ndarray | Path]] = []
    val = None
    for spec in specs:
        if spec.startswith("digits:"):
            if cfg.data.dataset != "digits":
                raise DataError(f"{spec!r} names held-out digits, but this checkpoint was trained on "
                                f"{cfg.data.dataset}; pass image files instead.")
            if val is None:
                val = build_datasets(cfg, splits=("val",))[1]
            lo, _, hi = spec[len("digits:"):].partition("-")
            try:
                idx = range(int(lo), int(hi or lo) + 1)
            except ValueError:
                raise DataError(f"{spec!r} is not a digits index or range like digits:0-7.") from None
            for i in idx:
                if not 0 <= i < len(val):
                    raise DataError(f"digits index {i} is outside the held-out split (0-{len(val) - 1}).")
                items.append((f"digits_{i:04d}", val.images[i]))
            continue
        p = Path(spec)
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.suffix.lower() in IMG_EXTENSIONS)
        elif p.is_file():
            files = [p]
        else:
            files = sorted(Path(f) for f in glob.glob(spec) if Path(f).suffix.lower() in IMG_EXTENSIONS)
        if not files:
            raise DataError(f"no images found for {spec!r}; pass image files, folders or globs.")
        items += [(f.stem, f) for f in files]
    return items


def resolve_target(target: str | None, classes: list[str]) -> int | None:
    if target is None:
        return None
    if target in classes:
        return classes.index(target)
    if target.lstrip("-").isdigit() and 0 <= int(target) < len(classes):
        return int(target)
    raise DataError(f"--target-class {target!r} is neither a class name nor an index below {len(classes)}.")


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    model, cfg, classes, _ = load_checkpoint(args.checkpoint)
    check_options(args, len(model.blocks))
    items = collect_inputs(args.images, cfg)
    target = resolve_target(args.target_class, classes)
    transform = build_transform(cfg.aug, cfg.model.img_size, train=False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    params = dict(head_fusion=args.head_fusion, discard_ratio=args.discard_ratio, start_layer=args.start_layer,
                  residual_alpha=args.residual_alpha, layer=args.layer)
    written = skipped = 0
    for start in range(0, len(items), args.batch_size):
        batch, shown, names = [], [], []
        for name, src in items[start : start + args.batch_size]:
            try:  # a file is decoded at the smallest JPEG scale the evaluation resize allows
                x = transform(src) if isinstance(src, np.ndarray) else transform.load(src)
            except BadImageError as e:
                print(f"skipping {e}", file=sys.stderr)
                skipped += 1
                continue
            batch.append(x)
            names.append(name)
            shown.append(to_display(x, cfg.aug.mean, cfg.aug.std))  # what the model saw, in [0, 1]
        if not batch:
            continue
        x = torch.stack(batch)
        tgt = None if target is None else torch.full((len(batch),), target, dtype=torch.long)
        maps, logits = attention_maps(model, x, args.method, tgt, args.head_fusion, args.discard_ratio,
                                      args.start_layer, args.layer, args.residual_alpha)
        probs = logits.softmax(1)
        top_p, top_i = probs.topk(min(5, len(classes)), dim=1)
        for j, name in enumerate(names):
            pred = int(top_i[j, 0])
            stem = out / f"{name}_{args.method}"
            grid_map = maps[j].numpy()
            buf = io.BytesIO()
            np.save(buf, grid_map)
            atomic_write_bytes(stem.with_suffix(".npy"), buf.getvalue())
            explained = classes[target] if target is not None else classes[pred]
            title = (f"{name}: predicted {classes[pred]} ({100 * float(top_p[j, 0]):.1f}%)  |  {args.method}"
                     + (f" for '{explained}'" if args.method == "grad_rollout" else ""))
            plot_attention_map(stem.with_suffix(".png"), shown[j], grid_map, title)
            sidecar = dict(image=name, method=args.method, params=params, explained_class=explained,
                           grid=list(grid_map.shape), checkpoint=str(args.checkpoint),
                           top5=[dict(cls=classes[int(i)], index=int(i), prob=float(p))
                                 for p, i in zip(top_p[j], top_i[j])])
            atomic_write_text(stem.with_suffix(".json"), json.dumps(sidecar, indent=1))
            written += 1
    print(f"wrote {written} map(s) to {out}/" + (f"; skipped {skipped} unreadable file(s)" if skipped else ""))
    return 0 if written else 2


if __name__ == "__main__":
    run_cli(main)
