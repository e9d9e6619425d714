"""Evaluate a frozen backbone from its features: weighted k-NN (DINO's protocol) or a linear probe (logistic
regression, its C chosen on a validation split), reported as evaluate.py reports a model.

    python features.py --checkpoint runs/default/best data/train/ --out feats/train.npz
    python features.py --checkpoint runs/default/best data/val/ --out feats/val.npz
    python probe.py --train feats/train.npz --test feats/val.npz --method knn --k 20 --temperature 0.07
    python probe.py --train feats/train.npz --test feats/val.npz --method linear --C 0.1 1 10

Labels are the images' folder names, as features.py stored them. The linear probe chooses C by top-1 on --val
(features of a validation folder), else by stratified 5-fold cross-validation on --train (fewer folds when a
class has fewer images; then refits on all of it); with a class of one training image nothing can be held out
and C is 1. Writes to --out (default: probe-<method>/):
metrics.json, per_class.csv, predictions.csv; prints top-1 and the per-class table.
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from vit.cli.help import HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--train", required=True, help="features of the labelled images (.npz or .parquet, features.py)")
    ap.add_argument("--test", required=True, help="features of the images to score")
    ap.add_argument("--val", default=None, help="linear: features that choose C (default: cross-validation on --train)")
    ap.add_argument("--method", choices=("knn", "linear"), default="knn", help="which probe")
    ap.add_argument("--k", type=int, default=20, help="knn: neighbours that vote")
    ap.add_argument("--temperature", type=float, default=0.07,
                    help="knn: T of the vote weight exp(similarity / T) (finite, above 0)")
    ap.add_argument("--C", type=float, nargs="+", default=[0.01, 0.1, 1.0, 10.0, 100.0, 1000.0],
                    help="linear: inverse regularisation strengths to choose from (each 1e-6 to 1e6)")
    ap.add_argument("--features", choices=("pooled", "patches"), default="pooled",
                    help="the pooled embeddings, or the patch tokens flattened in grid order (files written by "
                         "features.py --patch-tokens; they keep where things are)")
    ap.add_argument("--out", default=None, help="output folder (default: probe-<method>)")
    return ap


def main(argv=None) -> int:
    import json
    import math
    from pathlib import Path

    from vit.cli.outputs import check_writable
    from vit.config import ConfigError
    from vit.eval.features import load_features, use_patch_tokens
    from vit.eval.probes import check_C, probe
    from vit.utils.atomic import atomic_write_csv, atomic_write_text
    from vit.utils.untrusted_text import printable

    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.k < 1:
        raise ConfigError(f"--k must be at least 1, got {args.k}.")
    if not (math.isfinite(args.temperature) and args.temperature > 0):
        raise ConfigError(f"--temperature must be a finite number above 0 (the vote weighs exp(similarity / T)), "
                          f"got {args.temperature}.")
    try:
        check_C(args.C, "--C")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    out = Path(args.out or f"probe-{args.method}")
    check_writable(out)
    files = {"train": args.train, "test": args.test, **({"val": args.val} if args.val else {})}
    feats = {role: load_features(path) for role, path in files.items()}
    if args.features == "patches":
        use_patch_tokens(feats, files)
    train, test, val = feats["train"], feats["test"], feats.get("val")
    r = probe(train, test, args.method, args.k, args.temperature, tuple(args.C), val)

    metrics = {k: r[k] for k in ("method", "n_train", "n", "top1", "macro", "weighted", "settings", "classes")}
    metrics["features"] = args.features
    metrics["settings"] = {**r["settings"], "val_top1": {str(c): v for c, v in r["settings"].get("val_top1",
                                                                                                  {}).items()}}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=1))
    atomic_write_csv(out / "per_class.csv", ["class", "precision", "recall", "f1", "support"],
                     [{"class": c, **row} for c, row in zip(r["classes"], r["per_class"])])
    atomic_write_csv(out / "predictions.csv", ["path", "label_name", "pred_name", "correct"],
                     [{"path": p, "label_name": r["classes"][y], "pred_name": r["classes"][q], "correct": int(y == q)}
                      for p, y, q in zip(test["paths"].tolist(), r["labels"], r["pred"])])

    chosen = ", ".join(f"{k}={v}" for k, v in r["settings"].items() if k != "val_top1")
    print(f"{r['method']} probe on {args.features} features ({chosen}): {r['n_train']} training, {r['n']} test "
          f"images, top-1 {100 * r['top1']:.2f}%, macro F1 {r['macro']['f1']:.3f}")
    print(f"{'class':>20s} {'precision':>9s} {'recall':>7s} {'f1':>6s} {'n':>5s}")
    for c, row in zip(r["classes"], r["per_class"]):
        print(printable(f"{c[:20]:>20s} {row['precision']:9.3f} {row['recall']:7.3f} {row['f1']:6.3f} "
                        f"{row['support']:5d}"))
    print(printable(f"wrote {out}/metrics.json, per_class.csv, predictions.csv"))
    return 0

