"""Export a classifier to ONNX, TorchScript or a torch.export program, checked against PyTorch on real images.

    python export.py --checkpoint runs/default/best --format onnx --out exported/
    python export.py --checkpoint runs/x/best --format onnx torchscript exported-program
    python export.py --model vit_base_patch16_224 --weights vit_b16.safetensors --dynamic-img-size \\
        --format onnx --images val_photos/

Each file is reloaded right after it is written (ONNX Runtime, torch.jit.load, torch.export.load) and run on
batches of 1 and 5 evaluation images (and at a second image size when the model has dynamic_img_size): the
softmax probabilities must agree with the PyTorch model's within 1e-4 and the top-1 classes exactly, or the
command fails (exit 2). The images are the checkpoint's own validation split, or --images. Next to the model:
preprocessing.json (input size, mean, std, interpolation, crop_pct, label names: what a runtime needs) and
verification.json (the check's numbers). The batch dimension is dynamic; height and width too with
dynamic_img_size (multiples of the patch size). ONNX needs the export extra: pip install -e '.[export]'.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
import warnings
from pathlib import Path

# vit.deploy.export.FORMATS's keys (tests check they agree), named here so that --help needs no torch
EXPORT_FORMATS = ("onnx", "torchscript", "exported-program")


def build_parser() -> argparse.ArgumentParser:
    from vit.cli.help import HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter,
                                 epilog="Any --aug.* config key may follow (the preprocessing; train.py --help "
                                        "lists them).")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a checkpoint folder written by train.py (best/ or last/)")
    src.add_argument("--model", help="a model name, with --weights FILE or --pretrained")
    ap.add_argument("--weights", help="timm / HF-timm weights file for --model")
    ap.add_argument("--pretrained", action="store_true", help="--model's pretrained weights by name (hub)")
    ap.add_argument("--img-size", type=int, default=None, help="input size for --model (default: 224)")
    ap.add_argument("--dynamic-img-size", action="store_true",
                    help="--model: accept any height and width (positions resampled), exported as dynamic")
    ap.add_argument("--format", nargs="+", choices=(*EXPORT_FORMATS, "all"), default=["onnx"],
                    help="what to write")
    ap.add_argument("--images", nargs="*", default=None,
                    help="images to verify on (default: the checkpoint's validation split)")
    ap.add_argument("--out", default=None, help="output folder (default: <checkpoint>/export or runs/export-<model>)")
    return ap


if __name__ == "__main__":  # --help answers here, before torch and the model code are imported
    from vit.cli.help import exit_if_help

    exit_if_help(build_parser)


import numpy as np
import torch

from vit.cli.runtime import check_options, run_cli
from vit.config import ConfigError, parse_overrides
from vit.data import DataError, build_datasets
from vit.data.synthetic import photo_like
from vit.data.transforms import build_transform
from vit.deploy.export import (
    FORMATS,
    ExportableClassifier,
    export_model,
    load_exported,
    preprocessing,
    require_onnx,
    verify,
    write_preprocessing,
)
from vit.eval.inference import ImageFiles, collect_images, label_names, load_model_and_config
from vit.utils.atomic import atomic_write_text


def parse_args(argv):
    args, rest = build_parser().parse_known_args(argv)
    overrides = parse_overrides(rest)
    bad = [k for k in overrides if not k.startswith("aug.")]
    if bad:
        raise ConfigError(f"export.py takes only --aug.* overrides (the preprocessing), not --{bad[0]}.")
    check_options(args, ("img_size",))
    args.format = list(FORMATS) if "all" in args.format else list(dict.fromkeys(args.format))
    return args, overrides


def verification_images(args, cfg, classes, size: int, n: int = 5) -> tuple[torch.Tensor, str]:
    """(n, C, size, size) evaluation images through the model's own preprocessing, and where they came from."""
    transform = build_transform(cfg.aug, size, train=False)
    if args.images:
        paths, _ = collect_images(args.images)
        ds = ImageFiles(paths, transform, cfg.model.in_chans)
        xs = [x for x, ok, _ in (ds[i] for i in range(len(ds))) if ok][:n]
        if not xs:
            raise DataError(f"none of {' '.join(args.images)} is a readable image; pass images to verify on.")
        return torch.stack(xs), f"{len(xs)} image(s) from {' '.join(args.images)}"
    if args.checkpoint:
        _, val, _ = build_datasets(cfg, check_images=False, splits=("val",), classes=classes)
        val.transform = transform  # the same split at `size`: evaluation preprocessing has no randomness
        xs = [val[i][0] for i in range(min(n, len(val)))]
        return torch.stack(xs), f"{len(xs)} image(s) of the checkpoint's {cfg.data.dataset} validation split"
    rng = np.random.default_rng(0)  # a model by name and no images: photo-like generated ones
    xs = [transform(photo_like(rng, 320, 240)) for _ in range(n)]
    return torch.stack(xs), f"{n} generated photo-like image(s) (pass --images for real ones)"


def main(argv=None) -> int:
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    if "onnx" in args.format:
        require_onnx()  # before anything slow
    model, cfg, classes = load_model_and_config(args, overrides)
    classes = classes or label_names(model, model.num_classes)
    out = Path(args.out) if args.out else (Path(args.checkpoint) / "export" if args.checkpoint
                                           else Path("runs") / f"export-{args.model}")
    size = cfg.model.img_size
    x, source = verification_images(args, cfg, classes, size)
    batches = [x[:1], x]
    if model.dynamic_img_size:  # the same images at a second size, two patches larger
        x2, _ = verification_images(args, cfg, classes, size + 2 * model.patch_embed.patch_size[0])
        batches += [x2[:1], x2]
    wrapper = ExportableClassifier(model)
    out.mkdir(parents=True, exist_ok=True)
    write_preprocessing(out, preprocessing(model, cfg.aug, classes))
    print(f"verifying on {source}, batches {', '.join('x'.join(map(str, b.shape)) for b in batches)}")
    results = {}
    for fmt in args.format:
        t0 = time.perf_counter()
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):  # the exporters' chatter
            warnings.simplefilter("ignore")
            path = export_model(wrapper, fmt, out, x)
        seconds = time.perf_counter() - t0
        check = verify(model, load_exported(path, fmt), batches)  # raises ExportError on a mismatch
        results[fmt] = dict(file=str(path), export_seconds=seconds, **check)
        print(f"{fmt:<17} {path}  ({seconds:.1f} s)  max |p - p_torch| = {check['max_abs_prob_diff']:.1e} "
              f"(<= {check['atol']:g}), same top-1 on all {check['images']} rows: ok")
    atomic_write_text(out / "verification.json", json.dumps(dict(images=source, results=results), indent=1))
    print(f"wrote {out}/: {', '.join(Path(r['file']).name for r in results.values())}, preprocessing.json, "
          "verification.json")
    return 0


if __name__ == "__main__":
    run_cli(main)
