"""The pretraining experiment of docs/pretraining.md: DINO on all 1,797 digit images without their labels, then the
few-shot table of docs/few-labels.md on digits 5-9 (k-NN and linear probe on the frozen backbone, 1 / 5 / 10 labels
per class, seeds 0 1 2), against raw pixels (70.8 / 94.2 / 95.8 by k-NN) and the supervised 0-4 backbone.

    python scripts/digits_pretrain.py --out /tmp/digits_dino      # 3.7 CPU minutes pretraining + 0.4 the table
    python scripts/digits_pretrain.py --out /tmp/digits_mae300 --method mae --epochs 300   # 7.4 + 0.1

Expected (docs/pretraining.md, 12 epochs, one thread): k-NN on the patch tokens 68.8 / 93.6 / 94.9 at 1 / 5 / 10
labels per class, on the pooled [CLS] 37.1 / 55.1 / 62.8; MAE, 300 epochs: patch tokens 72.8 / 94.7 / 95.8 (above
raw pixels at every count), pooled 81.3 / 91.3 / 91.7; the table in --out/table/summary.csv, CPU minutes printed.
The 5-9 pool and test set are scripts/digits_transfer.py's (the same files); the pretraining sees every digit image
once per epoch, the test images included, without labels (the issue's "all digit images without labels").
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["--data.dataset=digits", "--data.val_fraction=0.05", "--optim.warmup_epochs=2", "--aug.label_smoothing=0",
          "--data.num_workers=0", "--run.num_threads=1"]
RECIPES = {
    "dino": ["--pretrain.method=dino", "--pretrain.out_dim=1024", "--pretrain.hidden_dim=256",
             "--pretrain.bottleneck_dim=64", "--pretrain.local_crops=4", "--pretrain.local_size=32",
             "--pretrain.koleo_weight=0.1", "--pretrain.momentum=0.996", "--pretrain.teacher_temp=0.04",
             "--optim.lr=2.5e-4"],
    "mae": ["--pretrain.method=mae", "--pretrain.mask_ratio=0.75", "--optim.lr=1e-3"],
}


def cpu_minutes() -> float:
    """CPU time (user + system) of the finished child processes so far, in minutes."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (r.ru_utime + r.ru_stime) / 60


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="a scratch folder for the digits, the run and the table")
    ap.add_argument("--epochs", type=int, default=12, help="pretraining epochs on the 1,797 digit images")
    ap.add_argument("--method", choices=sorted(RECIPES), default="dino", help="the pretraining recipe")
    ap.add_argument("--features", nargs="+", default=["pooled", "patches"], help="few_shot.py --features")
    ap.add_argument("--set", action="append", default=[], metavar="OVERRIDE",
                    help="a train.py override after the recipe's, repeatable: --set=--pretrain.ibot_weight=1")
    args = ap.parse_args()
    out = Path(args.out)
    sys.path.insert(0, str(ROOT / "scripts"))
    from digits_transfer import write_digits

    if not (out / "new" / "test").is_dir():
        write_digits(out)
    ckpt = out / args.method / "last"
    if not ckpt.is_dir():
        subprocess.run([sys.executable, str(ROOT / "train.py"), *RECIPES[args.method], *COMMON,
                        f"--run.output_dir={out}", f"--run.name={args.method}",
                        f"--run.epochs={args.epochs}", f"--run.eval_every={max(1, args.epochs // 3)}", *args.set],
                       check=True, cwd=ROOT)
        print(f"pretraining: {cpu_minutes():.1f} CPU minutes")
    before = cpu_minutes()
    subprocess.run([sys.executable, str(ROOT / "few_shot.py"), "--checkpoint", str(ckpt), "--train",
                    str(out / "new" / "train"), "--test", str(out / "new" / "test"), "--out", str(out / "table"),
                    "--methods", "knn", "linear", "--features", *args.features], check=True, cwd=ROOT)
    print(f"few-shot table: {cpu_minutes() - before:.1f} CPU minutes; {out / 'table' / 'summary.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
