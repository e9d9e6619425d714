"""Where the defect is, pixel by pixel: linear and DPT segmentation heads on one backbone, beside PatchCore's heat
maps, on generated inspection parts (docs/segmentation.md's table).

    OMP_NUM_THREADS=1 python scripts/seg_parts.py --out /tmp/segparts     # ~35 min on one shared CPU core

Expected (docs/segmentation.md's first table): the DPT head's mIoU 0.89-0.90 and every defect class's IoU above 0.8
on every seed (scratch 0.84-0.88, dent 0.81-0.85, stain 0.87-0.90), the linear head's 0.73-0.75 (a scratch about
2 px wide on a 4-px patch grid: 0.42-0.44); both heads' pixel AUROC above PatchCore's for every defect class (about
1.00 against 0.80-0.98). `--geometry resample --steps 300 --dpt-factors 2 1 0.5 0.25` gives the earlier tables'
rows (scratch IoU 0.25-0.33).

1. Good parts (vit.data.synthetic.inspection_part: brushed, grain, weave, knurl surfaces; 64 px) train a tiny ViT
   with train.py to tell the surfaces apart (patch 4: a 16x16 grid; 4 blocks of width 64): the shared backbone.
2. For each seed: parts with one scratch, dent or stain each and their masks (classes background, scratch, dent,
   stain) written as images/ + masks/ (the good parts without a mask file: all background); each head (linear on
   the last four blocks, DPT on all four) is trained with the backbone (full fine-tuning, cross-entropy + Dice,
   1,500 batches of 8; seg.geometry exact: flips, quarter turns, whole-pixel shifts); PatchCore
   (vit/eval/anomaly.py, blocks 1-2, 3x3 neighbourhood, 10% coreset) is fitted with the backbone on good parts of
   the same seed.
3. On the same test images: mIoU and per-class IoU of each head; per defect class the pixel AUROC of its pixels
   against the background pixels, scored by 1 - p(background) for a head and by PatchCore's patch map upsampled
   (bilinear) for PatchCore.
Prints one row per seed and head; writes results.json into --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZE, PATCH = 64, 4
CLASSES = ["background", "scratch", "dent", "stain"]
BACKBONE = [f"--model.img_size={SIZE}", f"--model.patch_size={PATCH}", "--model.embed_dim=64", "--model.depth=4",
            "--model.num_heads=4", "--model.mlp_ratio=2", "--data.batch_size=32", "--run.epochs=8",
            "--optim.lr=2e-3", "--optim.warmup_epochs=1", "--aug.random_resized_crop=false", "--aug.hflip=0.5",
            "--data.num_workers=0", "--run.eval_every=8"]
DPT = dict(sizes=(32, 64, 64, 64), factors=(4, 2, 1, 0.5), width=32, dropout=0.0)  # maps at 4x..1/2x the grid


def write_seg_parts(folder: Path, seed: int, good: int, per_defect: int) -> None:
    """folder/images/<i>.png and folder/masks/<i>.png (class indices) for the defective parts; good parts have no
    mask file. Surfaces cycle through the kinds."""
    import numpy as np
    from PIL import Image

    from vit.data.synthetic import DEFECTS, PART_KINDS, inspection_part

    rng = np.random.default_rng(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    (folder / "masks").mkdir(exist_ok=True)
    plan = [None] * good + [d for d in DEFECTS for _ in range(per_defect)]
    for i, defect in enumerate(plan):
        img, mask = inspection_part(rng, SIZE, PART_KINDS[i % len(PART_KINDS)], defect)
        Image.fromarray(img).save(folder / "images" / f"{i:04d}.png")
        if defect is not None:
            index = (mask * (DEFECTS.index(defect) + 1)).astype(np.uint8)  # (SIZE, SIZE) class indices
            Image.fromarray(index).save(folder / "masks" / f"{i:04d}.png")


def write_surfaces(folder: Path, seed: int, per_kind: int) -> None:
    """folder/<kind>/<i>.png: good parts of each surface (an ImageFolder for the backbone)."""
    import numpy as np
    from PIL import Image

    from vit.data.synthetic import PART_KINDS, inspection_part

    rng = np.random.default_rng(seed)
    for kind in PART_KINDS:
        (folder / kind).mkdir(parents=True, exist_ok=True)
        for i in range(per_kind):
            Image.fromarray(inspection_part(rng, SIZE, kind)[0]).save(folder / kind / f"{i:04d}.png")


def train_backbone(out: Path) -> Path:
    data = out / "surfaces"
    write_surfaces(data / "train", 100, 60)
    write_surfaces(data / "val", 101, 15)
    cmd = [sys.executable, str(ROOT / "train.py"), "--data.dataset=imagefolder", f"--data.root={data}",
           f"--run.output_dir={out}", "--run.name=backbone", "--run.overwrite=true", *BACKBONE]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return out / "backbone" / "best"


def train_head(backbone, head: str, train_ds, steps: int, seed: int, lr: float = 2e-3, backbone_lr: float = 5e-4,
               dpt: dict | None = None):
    """A Segmenter on a copy of `backbone`, every weight trained for `steps` batches of 8 (AdamW, one-cycle; the
    new head at `lr`, the backbone at `backbone_lr`), cross-entropy weighted by the square root of the inverse
    pixel frequency (defects are 1-4% of the pixels) plus Dice."""
    import copy

    import torch

    from vit.data.segmentation import pixel_class_weights
    from vit.models.segmenter import create_segmenter
    from vit.train.tasks.segmentation import seg_loss

    torch.manual_seed(seed)
    kw = (dpt or DPT) if head == "dpt" else {"blocks": 4}
    model = create_segmenter(copy.deepcopy(backbone), len(CLASSES), head, **kw)
    weights = pixel_class_weights(train_ds).sqrt()
    groups = [{"params": model.backbone.parameters(), "lr": backbone_lr}, {"params": model.head.parameters(), "lr": lr}]
    opt = torch.optim.AdamW(groups, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, [backbone_lr, lr], total_steps=steps, pct_start=0.1)
    loader = torch.utils.data.DataLoader(train_ds, batch_size=8, shuffle=True,
                                         generator=torch.Generator().manual_seed(seed))
    model.train()
    step, epoch = 0, 0
    while step < steps:
        train_ds.set_epoch(epoch)
        for x, y in loader:
            loss = seg_loss(model(x), y, "ce+dice", weights)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if step == steps:
                break
        epoch += 1
    return model.eval()


def pixel_rows(probs, masks, anomaly_maps) -> dict:
    """Per defect class: pixel AUROC of its pixels against background pixels, for 1 - p(background) and for
    PatchCore's maps (N, H, W)."""
    from vit.eval.segmentation import pixel_auroc

    seg_score, bg = 1 - probs[:, 0].numpy(), masks.numpy() == 0
    out = {}
    for c, name in enumerate(CLASSES[1:], start=1):
        pos = masks.numpy() == c
        sel = pos | bg
        out[name] = {"seg": pixel_auroc(seg_score[sel], pos[sel]),
                     "patchcore": pixel_auroc(anomaly_maps[sel], pos[sel])}
    return out


def run_seed(backbone, cfg, out: Path, seed: int, steps: int, train_n: int,
             heads: tuple[str, ...] = ("linear", "dpt"), dpt: dict | None = None,
             geometry: str = "exact") -> list[dict]:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from vit.cli.images import collect_images
    from vit.data.segmentation import SegmentationDataset, find_pairs, seg_transform
    from vit.data.transforms import build_transform
    from vit.eval.anomaly import fit_patchcore
    from vit.eval.inference import ImageFiles
    from vit.eval.segmentation import predict_masks, seg_scores

    d = out / f"seed{seed}"
    if not (d / "test").is_dir():
        write_seg_parts(d / "train", 1000 + seed, train_n // 4, train_n // 4)
        write_seg_parts(d / "good", 2000 + seed, 80, 0)
        write_seg_parts(d / "test", 3000 + seed, 20, 15)
    mean, std = cfg.aug.mean, cfg.aug.std
    train_ds = SegmentationDataset(find_pairs(d / "train", missing="background"), CLASSES,
                                   seg_transform(SIZE, True, mean, std, scale=(0.6, 1.0), rotate=20, jitter=0.1,
                                                 geometry=geometry),
                                   seed=seed)
    test_ds = SegmentationDataset(find_pairs(d / "test", missing="background"), CLASSES,
                                  seg_transform(SIZE, False, mean, std))
    test_loader = torch.utils.data.DataLoader(test_ds, batch_size=32)
    pc = fit_patchcore(backbone, ImageFiles(collect_images([str(d / "good" / "images")])[0],
                                            build_transform(cfg.aug, SIZE, train=False)), ratio=0.1, seed=seed)
    maps = pc.score_files(backbone, ImageFiles([p.image for p in test_ds.pairs],
                                               build_transform(cfg.aug, SIZE, train=False)))[1]
    maps = F.interpolate(torch.from_numpy(maps)[:, None], size=(SIZE, SIZE), mode="bilinear",
                         align_corners=False)[:, 0].numpy()
    rows = []
    for head in heads:
        t0 = time.perf_counter()
        model = train_head(backbone, head, train_ds, steps, seed, dpt=dpt)
        res = predict_masks(model, test_loader, len(CLASSES), keep_probs=True)
        s = seg_scores(res["confusion"])
        rows.append({"seed": seed, "head": head, "miou": s["miou"], "iou": dict(zip(CLASSES, s["iou"])),
                     "pixel_auroc": pixel_rows(res["probs"], res["masks"], maps), "train_s": time.perf_counter() - t0,
                     "defect_iou_min": float(np.min(s["iou"][1:]))})
    return rows


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="a scratch folder for the generated parts and the runs")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=1500, help="training batches of 8 per head")
    ap.add_argument("--train", type=int, default=200, help="training parts (a quarter good, a quarter per defect)")
    ap.add_argument("--heads", nargs="+", default=["linear", "dpt"], choices=["linear", "dpt"],
                    help="the heads trained and compared")
    ap.add_argument("--dpt-factors", type=float, nargs=4, default=list(DPT["factors"]),
                    help="the DPT head's four resampling factors against the patch grid (4 2 1 0.5, the default: "
                         "the finest map at pixel level for patch 4)")
    ap.add_argument("--geometry", default="exact", choices=["resample", "exact"],
                    help="training geometry (seg.geometry): resample: crops resized, rotations; exact: flips, "
                         "quarter turns and whole-pixel shifts, nothing resampled")
    ap.add_argument("--results", default="results.json", help="the file written into --out")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    torch.set_num_threads(1)
    out = Path(args.out)
    ckpt = out / "backbone" / "best"
    if not ckpt.is_dir():
        ckpt = train_backbone(out)
    from vit.models.checkpoint import load_checkpoint

    backbone, cfg, _, meta = load_checkpoint(ckpt)
    backbone.eval()
    print(f"backbone: surface top-1 {100 * meta['val_acc1']:.1f}% on held-out good parts", flush=True)
    rows = []
    for seed in args.seeds:
        dpt = {**DPT, "factors": tuple(args.dpt_factors)}
        for r in run_seed(backbone, cfg, out, seed, args.steps, args.train, tuple(args.heads), dpt,
                          args.geometry):
            r = {**r, "steps": args.steps, "geometry": args.geometry}
            rows.append({**r, "dpt_factors": list(args.dpt_factors)} if r["head"] == "dpt" else r)
            iou = "  ".join(f"{k} {100 * v:.1f}" for k, v in r["iou"].items())
            auc = "  ".join(f"{k} {v['seg']:.3f}/{v['patchcore']:.3f}" for k, v in r["pixel_auroc"].items())
            print(f"seed {seed} {r['head']:6s} mIoU {100 * r['miou']:.1f}  IoU: {iou}  pixel AUROC head/PatchCore: "
                  f"{auc}  ({r['train_s']:.0f} s)", flush=True)
        (out / args.results).write_text(json.dumps({"rows": rows, "backbone_val_acc1": meta["val_acc1"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
