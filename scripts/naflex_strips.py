"""NaFlex against the square resize on wide line-scan strips (issue 38), at the same patch budget and epochs.

    python scripts/naflex_strips.py --out /tmp/strips                 # 3 seeds x 2 arms + speed, ~15 min, 1 core
    python scripts/naflex_strips.py --out /tmp/strips --seeds 0 --epochs 2 --train-per-class 12   # a smoke run

The data (vit.data.synthetic.wide_strip, written as PNGs to OUT/data): strips of about 4:1 (48 px high, 176-208
px wide), classes good / crack / pits, each defect within the outer 12% of one end. Both arms see every image
whole, with `--budget` patches of `--patch` px at most:
- naflex: each strip at its own aspect ratio (a 4 x 16 grid for 4:1 at 64 patches), through train.py's data
  path (vit.data: data.naflex, the token-budget batches and the padding collate);
- square: the strip squashed to a square of the same budget (8 x 8 patches, 64 x 64 px), in train and val alike
  (the repository's evaluation crop would cut the ends, and the defects with them, away).
Same model, optimizer, schedule, epochs and seeds; the table gives each arm's validation top-1 per seed, and the
training throughput in valid tokens/s (the model's steps in CPU time of the one compute thread, and whole epochs
with loading by the clock), followed by an interleaved timing (vit.utils.timing, CPU time) of one training step on
a NaFlex batch against one on a fixed-size batch of as many tokens. `--model ours` (the default) trains the
architecture as our VisionTransformer (create_model by timm's name, NaFlex embeddings); `--model timm` timm's
NaFlexVit, for comparison.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: the repository's vit/

CLASSES = ("good", "crack", "pits")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the data and results.json")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--train-per-class", type=int, default=160)
    p.add_argument("--val-per-class", type=int, default=80)
    p.add_argument("--patch", type=int, default=8)
    p.add_argument("--budget", type=int, default=64, help="patches per image at most (max_num_patches)")
    p.add_argument("--batch", type=int, default=32, help="images per batch at the full budget")
    p.add_argument("--model", choices=("timm", "ours"), default="ours")
    p.add_argument("--lr", type=float, default=2e-3)
    return p


def make_strips(root: Path, per_class: dict[str, int], seed: int = 0) -> Path:
    """OUT/data/{train,val}/{good,crack,pits}/*.png, once (kept if complete)."""
    import numpy as np
    from PIL import Image

    from vit.data.synthetic import wide_strip

    done = root / "made.json"
    if done.is_file() and json.loads(done.read_text()) == per_class:
        return root
    rng = np.random.default_rng(seed)
    for split, n in per_class.items():
        for c in CLASSES:
            d = root / split / c
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                img = wide_strip(rng, int(rng.integers(176, 209)), 48, None if c == "good" else c)
                Image.fromarray(img).save(d / f"{i:04d}.png")
    done.write_text(json.dumps(per_class))
    return root


def build(kind: str, args, seed: int):
    import torch

    torch.manual_seed(seed)
    side = args.patch * math.isqrt(args.budget)  # the square arm's input side: budget patches
    if kind == "timm":
        import timm

        return timm.create_model("naflexvit_base_patch16_gap", pretrained=False, patch_size=args.patch, embed_dim=64,
                                 depth=4, num_heads=2, pos_embed_grid_size=(side // args.patch,) * 2,
                                 num_classes=len(CLASSES))
    from vit import create_model  # timm's architecture by its name, built as our VisionTransformer

    return create_model("naflexvit_base_patch16_gap", patch_size=args.patch, img_size=side, embed_dim=64, depth=4,
                        num_heads=2, num_classes=len(CLASSES))


def loaders(arm: str, args, data: Path, seed: int):
    """train.py's loaders for the data (vit.data.build_datasets / build_loaders), NaFlex or squashed."""
    from vit.config import AugConfig, Config, DataConfig, ModelConfig, NaFlexOptions, RunConfig
    from vit.data import build_datasets, build_loaders
    from vit.data.transforms import build_transform

    side = args.patch * math.isqrt(args.budget)
    cfg = Config(model=ModelConfig(img_size=side, patch_size=args.patch, in_chans=3),
                 data=DataConfig(dataset="imagefolder", root=str(data), batch_size=args.batch, num_workers=0,
                                 naflex=NaFlexOptions(args.budget) if arm == "naflex" else None),
                 aug=AugConfig(random_resized_crop=False, hflip=0.5, label_smoothing=0.1, mean=[0.5] * 3,
                               std=[0.5] * 3, interpolation="bilinear"),
                 run=RunConfig(seed=seed))
    train, val, classes = build_datasets(cfg)
    if arm == "square":  # evaluation squashes too (its default centre crop would cut the strip's ends off)
        val.transform = build_transform(dataclasses.replace(cfg.aug, hflip=0.0), side, True)
    return build_loaders(cfg, train, val), classes


def tokens(x, patch: int) -> int:
    """Valid patch tokens in a batch (a NaFlex dict or images (B, C, H, W))."""
    return int(x["patch_valid"].sum()) if isinstance(x, dict) else x.shape[0] * x.shape[2] * x.shape[3] // patch**2


def train_arm(arm: str, args, data: Path, seed: int) -> dict:
    import torch
    import torch.nn.functional as F

    from vit.train.optim import lr_at

    (train, val), _ = loaders(arm, args, data, seed)
    model = build(args.model, args, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    total, step = args.epochs * len(train), 0
    step_s = wall_s = 0.0
    n_tokens = 0
    for epoch in range(args.epochs):
        model.train()
        (getattr(train.batch_sampler, "set_epoch", None) or train.sampler.set_epoch)(epoch)  # (seed, epoch) order
        train.dataset.set_epoch(epoch)
        t_epoch = time.perf_counter()
        for x, y in train:
            for group in opt.param_groups:
                group["lr"] = lr_at(step, total, len(train), args.lr, 1e-5)  # one epoch of warm-up, then cosine
            t0 = time.thread_time()  # one compute thread: CPU time, unmoved by the machine's other load
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step_s += time.thread_time() - t0
            n_tokens += tokens(x, args.patch)
            step += 1
        wall_s += time.perf_counter() - t_epoch
    model.eval()
    correct = n = 0
    with torch.no_grad():
        for x, y in val:
            correct += int((model(x).argmax(1) == y).sum())
            n += len(y)
    return dict(arm=arm, seed=seed, val_acc1=correct / n, n_val=n, steps=step, tokens=n_tokens,
                tokens_per_s_step=n_tokens / step_s, tokens_per_s_epoch=n_tokens / wall_s,
                padded_share=padded_share(train) if arm == "naflex" else 0.0)


def padded_share(train) -> float:
    """The share of padding tokens in an epoch's batches (images x longest sequence)."""
    lengths, padded = train.batch_sampler.lengths, 0
    batches = train.batch_sampler.batches()
    for b in batches:
        padded += len(b) * max(lengths[i] for i in b)
    return 1 - sum(lengths) / padded


def step_speed(args, data: Path) -> dict:
    """One training step on a NaFlex batch against one on a fixed-size batch of as many tokens, interleaved."""
    import torch
    import torch.nn.functional as F

    from vit.utils.timing import interleaved, ratio_stats

    (nf_train, _), _ = loaders("naflex", args, data, 0)
    (sq_train, _), _ = loaders("square", args, data, 0)
    xs, ys = next(iter(sq_train))
    xn, yn = next(b for b in nf_train if len(b[1]) == len(ys))  # a full NaFlex batch of the same image count
    model = build(args.model, args, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(x, y):
        def run():
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return run

    # one compute thread: its CPU time is the step's work, whatever else the machine runs meanwhile
    t = interleaved({"naflex": step(xn, yn), "fixed": step(xs, ys)}, warmup=3, repeats=15)
    r = ratio_stats(t.cpu["naflex"], t.cpu["fixed"])  # fixed / NaFlex seconds per pair: > 1, NaFlex is faster
    tn, ts = tokens(xn, args.patch), tokens(xs, args.patch)
    return dict(naflex_tokens=tn, fixed_tokens=ts, images=len(ys),
                naflex_tokens_per_s=tn / min(t.cpu["naflex"]), fixed_tokens_per_s=ts / min(t.cpu["fixed"]),
                tokens_per_s_ratio_median=r["median"] * tn / ts, ratio_spread=[r["min"] * tn / ts, r["max"] * tn / ts])


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    torch.set_num_threads(1)
    out = Path(args.out)
    data = make_strips(out / "data", {"train": args.train_per_class, "val": args.val_per_class})
    rows = []
    for seed in args.seeds:
        for arm in ("naflex", "square"):
            rows.append(train_arm(arm, args, data, seed))
            r = rows[-1]
            print(f"{arm:7s} seed {seed}: val top-1 {100 * r['val_acc1']:.1f}% ({r['n_val']} strips), "
                  f"{r['tokens_per_s_step']:.0f} tokens/s (steps, CPU), "
                  f"{r['tokens_per_s_epoch']:.0f} tokens/s (epochs, wall), "
                  f"padding {100 * r['padded_share']:.1f}%", flush=True)
    speed = step_speed(args, data)
    print(f"one training step, interleaved: NaFlex {speed['naflex_tokens_per_s']:.0f} tokens/s "
          f"({speed['naflex_tokens']} tokens), fixed {speed['fixed_tokens_per_s']:.0f} tokens/s "
          f"({speed['fixed_tokens']} tokens); NaFlex / fixed {speed['tokens_per_s_ratio_median']:.3f} "
          f"(spread {speed['ratio_spread'][0]:.3f}-{speed['ratio_spread'][1]:.3f})")
    print("\n| arm | " + " | ".join(f"seed {s}" for s in args.seeds) + " | mean | tokens/s (steps, CPU) |")
    print("| --- | " + " | ".join("---" for _ in args.seeds) + " | --- | --- |")
    for arm in ("naflex", "square"):
        mine = [r for r in rows if r["arm"] == arm]
        accs = [100 * r["val_acc1"] for r in mine]
        tps = sum(r["tokens_per_s_step"] for r in mine) / len(mine)
        print(f"| {arm} | " + " | ".join(f"{a:.1f}" for a in accs) + f" | {sum(accs) / len(accs):.1f} | {tps:.0f} |")
    (out / "results.json").write_text(json.dumps(dict(args=vars(args), runs=rows, step_speed=speed), indent=1))
    print(f"wrote {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
