"""The detector's INT8 on generated inspection parts: image AUROC and batch-1 speed of features.int8.onnx /
dinomaly.int8.onnx against the fp32 files on ONNX Runtime, as export.py --quantize int8 measures them.

    OMP_NUM_THREADS=1 python scripts/anomaly_int8.py --out /tmp/int8-parts
    # ~5 min on one shared CPU thread; expected: see docs/anomaly.md's "INT8 on the edge" table

docs/anomaly.md's tiny ViT (128 px, patch 8: a 16x16 grid; 4 blocks of width 64), *untrained* (seeded random
weights: what is measured is how much INT8 changes the detector, not how good it is), PatchCore (blocks 1 and 2,
3x3, coreset 10%) and Dinomaly (--steps batches of 16) fitted on --good good parts (vit.data.synthetic), their
thresholds chosen on --val good and --val defective validation parts, each exported (vit.deploy.anomaly_export)
and quantized within --max-drop points of image AUROC (vit.deploy.anomaly_int8: dynamic and static, the faster
kept; the speed is the median of 7 interleaved repeats in one process). Prints one line per method.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="a folder for the parts and the exports")
    ap.add_argument("--good", type=int, default=64, help="good training parts")
    ap.add_argument("--val", type=int, default=40, help="good and defective validation parts, each")
    ap.add_argument("--steps", type=int, default=60, help="Dinomaly's training steps")
    ap.add_argument("--max-drop", type=float, default=1.0, help="points of image AUROC INT8 may lose")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import numpy as np
    import torch
    from PIL import Image

    from vit import create_model
    from vit.config import AugConfig
    from vit.data.synthetic import DEFECTS, inspection_part
    from vit.data.transforms import build_transform
    from vit.deploy.anomaly_export import export_detector
    from vit.deploy.anomaly_int8 import describe_detector_change, detector_images, quantize_detector
    from vit.deploy.export import preprocessing, write_preprocessing
    from vit.deploy.onnx_anomaly import open_detector
    from vit.eval.anomaly import fit_patchcore
    from vit.eval.anomaly_threshold import choose_threshold
    from vit.eval.dinomaly import fit_dinomaly
    from vit.eval.inference import ImageFiles

    out, rng = Path(args.out), np.random.default_rng(0)
    folders = {"train": args.good, "val": args.val, "vald": args.val}
    for split, n in folders.items():
        (out / split).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            defect = DEFECTS[i % len(DEFECTS)] if split == "vald" else None
            Image.fromarray(inspection_part(rng, 128, "weave", defect)[0]).save(out / split / f"{i}.png")
    torch.manual_seed(0)
    model = create_model("vit_tiny_patch16_224", img_size=128, patch_size=8, depth=4, embed_dim=64, num_heads=2,
                         num_classes=4).eval()
    aug = AugConfig()
    t = build_transform(aug, 128, train=False)
    files = {s: ImageFiles(sorted((out / s).glob("*.png")), t) for s in folders}
    fitted = dict(good=[str(out / "train")], val=[str(out / "val")], val_defects=[str(out / "vald")])
    for name, fit in (("patchcore", lambda: fit_patchcore(model, files["train"], ratio=0.1)),
                      ("dinomaly", lambda: fit_dinomaly(model, files["train"], args.steps))):
        det = fit()
        det.threshold = choose_threshold(det.score_files(model, files["val"])[0],
                                         det.score_files(model, files["vald"])[0]).value
        exp = out / f"export-{name}"
        pre = write_preprocessing(exp, preprocessing(model, aug, ["a", "b", "c", "d"]))
        x = torch.stack([files["val"][i][0] for i in range(4)])
        export_detector(model, det, exp / "anomaly", [x], pre)
        data = detector_images(fitted, open_detector(exp / "anomaly").preprocess)
        res = quantize_detector(exp / "anomaly", data, ("dynamic", "static"), args.max_drop, threads=1,
                                log=lambda s: None)
        sp = res["speed"]["int8_over_ort_fp32"]
        print(f"{name:<10} int8 ({res['method']}): {describe_detector_change(res)}; "
              f"{res['bytes_fp32'] / 2**20:.2f} -> {res['bytes_int8'] / 2**20:.2f} MiB; batch 1, 1 thread: "
              f"{sp['median']:.2f}x ONNX Runtime fp32 (min {sp['min']:.2f}, max {sp['max']:.2f}, 7 repeats)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
