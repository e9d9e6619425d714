"""The transfer experiment of docs/few-labels.md: a backbone trained by train.py on digits 0-4 only, adapted to
digits 5-9 with 1, 5 and 10 labels per class by k-NN, linear probe, LoRA and full fine-tuning, three seeds.

    python scripts/digits_transfer.py --out /tmp/digits      # ~40-60 min on 2 busy CPU cores; table: docs/few-labels.md

scikit-learn's 8x8 digits (nothing downloaded) as PNG folders: 0-4 split 80/20 for the backbone (the model
and preprocessing of configs/default.yaml, --epochs epochs); 5-9 split in half, a labelled pool and a test set. Then
few_shot.py writes the table (few_shot.csv, summary.csv, few_shot.png) into --out/table.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_digits(out: Path) -> None:
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    imgs = np.clip(d.images * 16, 0, 255).astype(np.uint8)  # (N, 8, 8) as vit.data's digits
    old, new = np.flatnonzero(d.target < 5), np.flatnonzero(d.target >= 5)
    tr, va = train_test_split(old, test_size=0.2, random_state=0, stratify=d.target[old])
    pool, test = train_test_split(new, test_size=0.5, random_state=0, stratify=d.target[new])
    for folder, idx in (("old/train", tr), ("old/val", va), ("new/train", pool), ("new/test", test)):
        for i in idx:
            (out / folder / str(d.target[i])).mkdir(parents=True, exist_ok=True)
            Image.fromarray(imgs[i]).save(out / folder / str(d.target[i]) / f"{i:04d}.png")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="a scratch folder for the digits, the run and the table")
    ap.add_argument("--epochs", type=int, default=20, help="backbone training epochs on digits 0-4")
    args = ap.parse_args()
    out = Path(args.out)
    if not (out / "new" / "test").is_dir():
        write_digits(out)
    ckpt = out / "backbone" / "best"
    if not ckpt.is_dir():
        subprocess.run([sys.executable, str(ROOT / "train.py"), "--data.dataset=imagefolder",
                        f"--data.root={out / 'old'}", f"--run.output_dir={out}", "--run.name=backbone",
                        f"--run.epochs={args.epochs}", f"--run.eval_every={args.epochs}", "--data.num_workers=0",
                        "--aug.interpolation=bicubic"], check=True, cwd=ROOT)
    subprocess.run([sys.executable, str(ROOT / "few_shot.py"), "--checkpoint", str(ckpt), "--train",
                    str(out / "new" / "train"), "--test", str(out / "new" / "test"), "--out", str(out / "table"),
                    "--features", "pooled", "patches"],
                   check=True, cwd=ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
