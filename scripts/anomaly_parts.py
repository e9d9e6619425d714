"""Anomaly detection on generated inspection parts, three methods on the same images, with a backbone trained here:
the comparison of docs/anomaly.md.

    OMP_NUM_THREADS=1 python scripts/anomaly_parts.py --out /tmp/parts --good 320 --steps 200 --repeats 1
    # ~40 min on one shared CPU thread; expected (means of 3 seeds): see docs/anomaly.md's table

1. Good parts only (vit.data.synthetic.inspection_part: brushed, grain, weave, knurl surfaces) train a tiny ViT
   with train.py to tell the four surfaces apart (128 px, patch 8: a 16x16 grid; 4 blocks of width 64; no defect
   is ever seen).
2. For each seed (one at a time; every method sees the same images): new good training parts, good validation
   parts with 15 defective ones (the F1 threshold), and a test set of 60 good parts and 60 with a scratch, dent
   or stain, each defect's mask beside it (<i>.mask.npy). PatchCore (anomaly.py's defaults: blocks 1 and 2, 3x3
   neighbourhood, coreset 10%), AnomalyDINO on the first 1, 2, 4 and 8 good parts (--shots), and Dinomaly
   (--steps batches of 16): image AUROC, pixel AUROC and AUPRO (to 30% FPR; vit.eval.anomaly_metrics), recall
   and false alarms at the threshold, the share of defective images whose hottest patch touches the defect, fit
   time, and scoring speed beside plain classification of the same decoded images (median of --repeats).
Prints one row per method and seed and a table of means; writes results.json into --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZE, PATCH = 128, 8
TRAIN_GOOD = 1280  # good parts in the bank by default, 320 of each surface (--good; 320 and 640 score lower: docs)
BACKBONE = [f"--model.img_size={SIZE}", f"--model.patch_size={PATCH}", "--model.embed_dim=64", "--model.depth=4",
            "--model.num_heads=4", "--model.mlp_ratio=2", "--data.batch_size=32", "--run.epochs=10",
            "--optim.lr=2e-3", "--optim.warmup_epochs=1", "--aug.random_resized_crop=false", "--aug.hflip=0.5",
            "--data.num_workers=0", "--run.eval_every=10"]


def write_parts(folder: Path, seed: int, counts: dict[str, int], defects: bool) -> None:
    """folder/<kind or defect>/<i>.png; good parts cycle through the kinds, defective ones through both."""
    import numpy as np
    from PIL import Image

    from vit.data.synthetic import DEFECTS, PART_KINDS, inspection_part

    rng = np.random.default_rng(seed)
    for name, n in counts.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            kind = name if name in PART_KINDS else PART_KINDS[i % len(PART_KINDS)]
            defect = name if name in DEFECTS else None
            img, mask = inspection_part(rng, SIZE, kind, defect)
            Image.fromarray(img).save(folder / name / f"{i:04d}.png")
            if defects and defect:
                np.save(folder / name / f"{i:04d}.mask.npy", mask)


def train_backbone(out: Path) -> Path:
    from vit.data.synthetic import PART_KINDS

    data = out / "surfaces"
    write_parts(data / "train", 100, {k: 60 for k in PART_KINDS}, False)
    write_parts(data / "val", 101, {k: 15 for k in PART_KINDS}, False)
    cmd = [sys.executable, str(ROOT / "train.py"), "--data.dataset=imagefolder", f"--data.root={data}",
           f"--run.output_dir={out}", "--run.name=backbone", "--run.overwrite=true", *BACKBONE]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return out / "backbone" / "best"


def train_cnn(out: Path, name: str, epochs: int = 10) -> tuple[Path, float]:
    """A timm CNN (`name`, 4 classes) trained from scratch here to tell the four surfaces apart, on the surface parts
    train_backbone uses (hflips, AdamW 1e-3 with a cosine decay, batches of 32): (its weights file, held-out top-1).
    timm's train.py would do the same; this toolkit's train.py builds ViTs."""
    import timm
    import torch
    from safetensors.torch import save_file

    from vit.cli.images import collect_images
    from vit.data.synthetic import PART_KINDS
    from vit.eval.inference import ImageFiles

    data, path = out / "surfaces", out / f"{name}.safetensors"
    if not (data / "val").is_dir():
        write_parts(data / "train", 100, {k: 60 for k in PART_KINDS}, False)
        write_parts(data / "val", 101, {k: 15 for k in PART_KINDS}, False)

    def tensors(split):
        files = ImageFiles(collect_images([str(data / split)])[0], cnn_transform())
        return torch.stack([files[i][0] for i in range(len(files))]), torch.tensor(
            [PART_KINDS.index(p.parent.name) for p in files.paths])

    (x, y), (xv, yv) = tensors("train"), tensors("val")
    torch.manual_seed(0)
    net = timm.create_model(name, num_classes=len(PART_KINDS))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.05)
    steps = epochs * -(-len(x) // 32)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, 1e-3, total_steps=steps, pct_start=0.1)
    for _ in range(epochs):
        net.train()
        for idx in torch.randperm(len(x)).split(32):
            flip = torch.rand(len(idx)) < 0.5
            xb = torch.where(flip[:, None, None, None], x[idx].flip(-1), x[idx])
            loss = torch.nn.functional.cross_entropy(net(xb), y[idx])
            opt.zero_grad(), loss.backward(), opt.step(), sched.step()
    net.eval()
    with torch.no_grad():
        top1 = float((net(xv).argmax(1) == yv).float().mean())
    save_file(net.state_dict(), str(path))
    return path, top1


def cnn_transform():
    """ImageNet's mean and std, the whole image (timm's CNN preprocessing without the crop)."""
    from vit.config.schema import AugConfig
    from vit.data.transforms import build_transform

    return build_transform(AugConfig(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], eval_crop_pct=1.0,
                                     interpolation="bicubic"), SIZE, train=False)


class AnomalibPatchCore:
    """anomalib's PatchcoreModel (2.7.0: layer2 + layer3, 3x3 average, coreset of `ratio` by its KCenterGreedy, image
    score reweighted by the bank's 9 nearest neighbours, map upsampled and Gaussian-blurred) on the same CNN weights,
    behind the detector interface run_seed reads (score, score_files, threshold)."""

    def __init__(self, backbone, name: str, train, ratio: float = 0.1, batch_size: int = 32) -> None:
        import torch
        from anomalib.models.image.patchcore.torch_model import PatchcoreModel

        self.model = PatchcoreModel(layers=["layer2", "layer3"], backbone=name, pre_trained=False)
        self.model.feature_extractor.feature_extractor.load_state_dict(backbone.body.state_dict(), strict=False)
        self.model.train()
        for start in range(0, len(train), batch_size):
            self.model(torch.stack([train[i][0] for i in range(start, min(start + batch_size, len(train)))]))
        self.model.subsample_embedding(ratio)
        self.model.eval()
        self.threshold = None

    def score(self, _model, x):
        import torch

        with torch.no_grad():
            out = self.model(x)
        return out.pred_score.flatten(), out.anomaly_map[:, 0]

    def score_files(self, model, files, batch_size: int = 32):
        from vit.eval.anomaly import score_files

        return score_files(self, model, files, batch_size)


def make_seed_data(out: Path, seed: int, good: int) -> Path:
    """out/seed<k>/: train/good (`good` parts), val/good (40), val_defects/<defect> (5 each: the F1 threshold's
    images) and test/ (60 good, 20 of each defect), with each defect's mask beside it (<i>.mask.npy)."""
    d = out / f"seed{seed}"
    if len(list((d / "train" / "good").glob("*.png"))) != good:
        write_parts(d / "train", 1000 + seed, {"good": good}, False)
        numbered = sorted((d / "train" / "good").glob("*.png"), key=lambda p: int(p.stem))  # 9999 before 10000
        for extra in numbered[good:]:  # from an earlier, larger --good
            extra.unlink()
    if not (d / "val_defects").is_dir():
        write_parts(d / "val", 2000 + seed, {"good": 40}, False)
        write_parts(d / "val_defects", 2500 + seed, {"scratch": 5, "dent": 5, "stain": 5}, True)
        write_parts(d / "test", 3000 + seed, {"good": 60, "scratch": 20, "dent": 20, "stain": 20}, True)
    return d


def fit_method(model, train, method: str, seed: int, neighbourhood: int, steps: int):
    from vit.eval.anomaly import METHODS, fit_patchcore
    from vit.eval.dinomaly import fit_dinomaly

    if method == "dinomaly":
        return fit_dinomaly(model, train, steps=steps, seed=seed)
    if method == "anomalib-patchcore":
        return AnomalibPatchCore(model, model.name, train)
    kw = dict(METHODS[method])
    kw["neighbourhood"] = neighbourhood if method == "patchcore" else kw["neighbourhood"]
    return fit_patchcore(model, train, seed=seed, method=method, **kw)


def run_seed(model, transform, out: Path, seed: int, method: str, neighbourhood: int = 3, repeats: int = 3,
             good: int = TRAIN_GOOD, shots: int | None = None, steps: int = 1000) -> dict:
    """One method on one seed's parts: fit on the good training parts (the first `shots` of them when given),
    threshold at the best F1 on the validation parts, then the test parts' image AUROC, pixel AUROC, AUPRO and
    hottest-patch hits; scoring speed beside plain classification of the same decoded images (medians)."""
    import numpy as np
    import torch

    from vit.cli.images import collect_images
    from vit.eval.anomaly_metrics import aupro, auroc, pixel_auroc, upsample_maps
    from vit.eval.anomaly_threshold import choose_threshold
    from vit.eval.inference import ImageFiles

    d = make_seed_data(out, seed, good)
    files = lambda sub: ImageFiles(collect_images([str(d / sub)])[0], transform)  # noqa: E731
    train = files("train")
    if shots:
        train = ImageFiles(train.paths[:shots], transform)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    det = fit_method(model, train, method, seed, neighbourhood, steps)
    fit_s = time.perf_counter() - t0
    det.threshold = choose_threshold(det.score_files(model, files("val"))[0],
                                     det.score_files(model, files("val_defects"))[0]).value
    test = files("test")
    scores, maps, _ = det.score_files(model, test)
    batches = [torch.stack([test[i][0] for i in range(s, min(s + 32, len(test)))]) for s in range(0, len(test), 32)]

    def classify():
        with torch.no_grad():
            for x in batches:
                model(x)

    speed = {"score": [], "classify": []}  # the same decoded batches both ways, alternated, median of `repeats`
    for _ in range(repeats):
        for name, fn in (("score", lambda: [det.score(model, x) for x in batches]), ("classify", classify)):
            t0 = time.perf_counter()
            fn()
            speed[name].append(len(test) / (time.perf_counter() - t0))
    defective = np.array([p.parent.name != "good" for p in test.paths])
    masks = np.stack([np.load(p.with_suffix(".mask.npy")) if p.parent.name != "good" else np.zeros((SIZE, SIZE), bool)
                      for p in test.paths])
    full = upsample_maps(maps, (SIZE, SIZE))  # (N, SIZE, SIZE) bilinear from the 16 x 16 patch maps
    hits = []
    for m, mask, bad in zip(maps, masks, defective):
        if bad:
            r, c = np.unravel_index(int(m.argmax()), m.shape)
            step = SIZE // m.shape[0]  # a patch, a CNN level's stride, or a pixel (anomalib's full-size map)
            hits.append(bool(mask[r * step:(r + 1) * step, c * step:(c + 1) * step].any()))
    return {"seed": seed, "method": method, "shots": shots or len(train), "neighbourhood": neighbourhood,
            "auroc": auroc(scores, defective), "pixel_auroc": pixel_auroc(full, masks), "aupro": aupro(full, masks),
            "threshold": det.threshold, "recall": float((scores[defective] >= det.threshold).mean()),
            "false_alarms": int((scores[~defective] >= det.threshold).sum()), "good_test": int((~defective).sum()),
            "peak_on_defect": float(np.mean(hits)), "fit_s": fit_s,
            "score_images_per_s": float(np.median(speed["score"])),
            "classify_images_per_s": float(np.median(speed["classify"]))}


def label(r: dict) -> str:
    if r["method"] in ("patchcore", "anomalib-patchcore"):
        name = f"{r['method']} {r['neighbourhood']}x{r['neighbourhood']}"
    else:
        name = f"anomalydino, {r['shots']} good" if r["method"] == "anomalydino" else "dinomaly"
    return name + (f" on {r['cnn']}" if r.get("cnn") else "")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="a scratch folder for the generated parts and the run")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--good", type=int, default=TRAIN_GOOD, help="good parts in the bank (before the coreset)")
    ap.add_argument("--methods", nargs="+", default=["patchcore", "anomalydino", "dinomaly"],
                    choices=["patchcore", "anomalydino", "dinomaly", "anomalib-patchcore"])
    ap.add_argument("--neighbourhoods", type=int, nargs="+", default=[3],
                    help="PatchCore's 3x3 feature averaging, and none (1), compared")
    ap.add_argument("--shots", type=int, nargs="+", default=[1, 2, 4, 8],
                    help="AnomalyDINO's few-shot runs: good images in its bank (0: all --good of them)")
    ap.add_argument("--repeats", type=int, default=3, help="timed scoring passes (the median is reported)")
    ap.add_argument("--steps", type=int, default=1000, help="Dinomaly's training steps (batches of 16)")
    ap.add_argument("--backbone", default=None, help="a checkpoint folder to use instead of the surface classifier "
                    "trained here (e.g. a train.py --pretrain.method=dino run's last/ on good parts)")
    ap.add_argument("--cnn", default=None, metavar="NAME",
                    help="a timm CNN (resnet18, wide_resnet50_2) trained here on the surfaces as the backbone instead "
                         "(vit.models.cnn_backbone); --methods anomalib-patchcore runs anomalib's PatchCore on it")
    ap.add_argument("--cnn-epochs", type=int, default=10, help="--cnn: its training epochs")
    return ap


def load_backbone(args, out: Path):
    """(model in eval mode, its evaluation transform, its checkpoint or weights, its training record): --cnn's timm
    CNN trained here, or --backbone's checkpoint, or the surface ViT trained here."""
    if args.cnn:
        from vit.models.cnn_backbone import load_cnn_backbone

        weights, top1 = train_cnn(out, args.cnn, args.cnn_epochs)
        model, _ = load_cnn_backbone(args.cnn, weights=weights, img_size=SIZE)
        print(f"backbone: {args.cnn}, surface top-1 {100 * top1:.1f}% on held-out good parts")
        return model, cnn_transform(), weights, {"val_acc1": top1}
    from vit.data.transforms import build_transform
    from vit.models.checkpoint import load_checkpoint

    ckpt = Path(args.backbone) if args.backbone else out / "backbone" / "best"
    if not ckpt.is_dir():
        ckpt = train_backbone(out)
    model, cfg, _, meta = load_checkpoint(ckpt)
    print(f"backbone: surface top-1 {100 * meta['val_acc1']:.1f}% on held-out good parts" if "val_acc1" in meta else
          f"backbone: {ckpt} ({cfg.pretrain.method or 'supervised'}, no labels)")
    return model.eval(), build_transform(cfg.aug, SIZE, train=False), ckpt, meta


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.good < 1 or any(n < 1 or n % 2 == 0 for n in args.neighbourhoods):  # before minutes of training
        ap.error(f"--good must be at least 1 part and every --neighbourhoods an odd number (3, or 1 for none), got "
                 f"{args.good} and {' '.join(map(str, args.neighbourhoods))}")
    if "anomalib-patchcore" in args.methods and not args.cnn:
        ap.error("--methods anomalib-patchcore runs on a CNN backbone: pass --cnn resnet18 (or another timm CNN)")
    out = Path(args.out)
    model, transform, ckpt, meta = load_backbone(args, out)
    runs = [("patchcore", n, None) for n in args.neighbourhoods] * ("patchcore" in args.methods)
    runs += [("anomalydino", 1, k or None) for k in args.shots] * ("anomalydino" in args.methods)
    runs += [("dinomaly", 1, None)] * ("dinomaly" in args.methods)
    runs += [("anomalib-patchcore", 3, None)] * ("anomalib-patchcore" in args.methods)
    rows = []
    for s in args.seeds:  # one seed at a time: its parts are made once and every method sees the same images
        for method, n, shots in runs:
            rows.append(r := run_seed(model, transform, out, s, method, n, args.repeats, args.good, shots,
                                      args.steps) | {"backbone": str(ckpt), "cnn": args.cnn})
            print(f"{label(r)} seed {r['seed']}: image AUROC {r['auroc']:.4f}  pixel AUROC {r['pixel_auroc']:.4f}  "
                  f"AUPRO {r['aupro']:.4f}  recall {r['recall']:.2f} ({r['false_alarms']}/{r['good_test']} false "
                  f"alarms at the F1 threshold)  hottest patch on the defect {100 * r['peak_on_defect']:.0f}%  fit "
                  f"{r['fit_s']:.1f} s  scoring {r['score_images_per_s']:.0f} images/s (classifying "
                  f"{r['classify_images_per_s']:.0f})", flush=True)
    mean = {}
    for name in dict.fromkeys(label(r) for r in rows):
        sub = [r for r in rows if label(r) == name]
        mean[name] = {k: sum(r[k] for r in sub) / len(sub)
                      for k in ("auroc", "pixel_auroc", "aupro", "recall", "peak_on_defect", "fit_s",
                                "score_images_per_s")}
        m = mean[name]
        print(f"| {name} | {m['auroc']:.3f} | {m['pixel_auroc']:.3f} | {m['aupro']:.3f} | {m['fit_s']:.1f} | "
              f"{m['score_images_per_s']:.0f} |  (means over {len(sub)} seeds)")
    (out / "results.json").write_text(json.dumps({"seeds": rows, "mean": mean, "backbone": str(ckpt),
                                                  "backbone_val_acc1": meta.get("val_acc1")},
                                                 indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
