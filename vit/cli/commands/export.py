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
dynamic_img_size (multiples of the pixels per token: the patch size, a hybrid's stem stride times it). ONNX needs
the export extra: pip install -e '.[export]'.
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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# vit.deploy.export.FORMATS's keys (tests check they agree), named here so that --help needs no torch
EXPORT_FORMATS = ("onnx", "torchscript", "exported-program")


def build_parser() -> argparse.ArgumentParser:
    from vit.cli.args import add_model_source
    from vit.cli.help import AUG_EPILOG, HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter,
                                 epilog=AUG_EPILOG)
    add_model_source(ap)  # --checkpoint | --model NAME [--pretrained | --weights FILE], --img-size (vit/cli/args.py)
    ap.add_argument("--dynamic-img-size", action="store_true",
                    help="--model: accept any height and width (positions resampled), exported as dynamic")
    ap.add_argument("--token-reduction", default=None, metavar="SPEC",
                    help="export with token merging at a fixed r, e.g. merge:8 (static token counts)")
    ap.add_argument("--format", nargs="+", choices=(*EXPORT_FORMATS, "all"), default=["onnx"],
                    help="what to write")
    ap.add_argument("--images", nargs="*", default=None,
                    help="images to verify on (default: the checkpoint's validation split)")
    ap.add_argument("--out", default=None, help="output folder (default: <checkpoint>/export or runs/export-<model>)")
    q = ap.add_argument_group("INT8 (ONNX Runtime; docs in vit/deploy/quantize.py)")
    q.add_argument("--quantize", choices=("int8",), default=None,
                   help="also write model.int8.onnx, quantized within --max-drop (implies --format onnx)")
    q.add_argument("--int8-method", choices=("auto", "dynamic", "static"), default="auto",
                   help="dynamic: weights only; static: QDQ with activations calibrated on training images; "
                        "auto: both, the faster one that keeps the budget")
    q.add_argument("--max-drop", "--max-top1-drop", dest="max_drop", type=float, default=0.5,
                   help="points of --int8-metric INT8 may lose against the fp32 export on the evaluation images "
                        "(a gain always passes)")
    q.add_argument("--int8-metric", choices=("top1", "map", "micro_f1"), default=None,
                   help="what the budget measures (default: top1; mAP for a multi-label checkpoint, micro_f1 at "
                        "its threshold on request)")
    q.add_argument("--eval-images", default=None,
                   help="a folder of <class>/<image> to measure the budget on (default: the checkpoint's validation "
                        "split); with --model also the calibration images")
    q.add_argument("--calibration-images", type=int, default=64,
                   help="training images that calibrate static INT8 (and rank the layers' sensitivity)")
    q.add_argument("--threads", type=int, default=1, help="ONNX Runtime and torch threads for the speed check")
    return ap


def parse_args(argv):
    from vit.cli.args import parse_command
    from vit.config import ConfigError
    from vit.deploy.export import FORMATS

    args, overrides = parse_command(build_parser(), argv, "export.py", ("aug.",),
                                    ("img_size", "calibration_images", "threads"))
    args.format = list(FORMATS) if "all" in args.format else list(dict.fromkeys(args.format))
    if args.quantize and "onnx" not in args.format:
        args.format.insert(0, "onnx")  # INT8 is made from the verified fp32 ONNX file
    if not 0 <= args.max_drop <= 100 or args.max_drop != args.max_drop:
        raise ConfigError(f"--max-drop is in points of the metric, between 0 and 100; got {args.max_drop}.")
    if args.quantize and not (args.checkpoint or args.eval_images):
        raise ConfigError("--quantize needs labelled images to keep its budget: pass --checkpoint (its "
                          "validation split) or --eval-images FOLDER (class subfolders).")
    if args.quantize and args.eval_images and not Path(args.eval_images).is_dir():
        raise ConfigError(f"--eval-images {args.eval_images} is not a folder; pass a folder of <class>/<image>.")
    return args, overrides


def verification_images(args, cfg, classes, size: int, n: int = 5) -> tuple[torch.Tensor, str]:
    """(n, C, size, size) evaluation images through the model's own preprocessing, and where they came from."""
    import numpy as np
    import torch

    from vit.cli.images import collect_images
    from vit.data import DataError, build_datasets
    from vit.data.synthetic import photo_like
    from vit.data.transforms import build_transform
    from vit.deploy.int8 import samples
    from vit.eval.inference import ImageFiles

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
        xs = [x for x, _ in samples(val, n)]
        return torch.stack(xs), f"{len(xs)} image(s) of the checkpoint's {cfg.data.dataset} validation split"
    rng = np.random.default_rng(0)  # a model by name and no images: photo-like generated ones
    xs = [transform(photo_like(rng, 320, 240)) for _ in range(n)]
    return torch.stack(xs), f"{n} generated photo-like image(s) (pass --images for real ones)"


def previous_results(out: Path, model_id: str, exported: list[str]) -> dict:
    """Entries of an earlier verification.json that still hold: formats not exported now whose file is there
    and was verified for this same model. A file left by another model is renamed <name>.stale, since the new
    preprocessing.json would no longer describe it."""
    from vit.deploy.export import FORMATS
    from vit.deploy.int8 import INT8_FILE

    try:
        old = json.loads((out / "verification.json").read_text())
    except (OSError, ValueError):
        old = {}
    names = {**FORMATS, "int8": INT8_FILE}
    kept = {}
    for fmt, name in names.items():
        if fmt in exported or not (out / name).is_file():
            continue
        entry = old.get("results", {}).get(fmt) if isinstance(old, dict) else None
        if isinstance(entry, dict) and entry.get("model_fingerprint") == model_id:
            kept[fmt] = entry
        else:
            (out / name).replace(out / f"{name}.stale")
            print(f"{out / name} was made from another model: renamed {name}.stale")
    return kept


def main(argv=None) -> int:
    import shutil
    import tempfile

    from vit.cli.args import load_model
    from vit.cli.outputs import check_writable
    from vit.config import ConfigError
    from vit.deploy.export import (
        ExportableClassifier,
        export_patchcore,
        fingerprint,
        preprocessing,
        require_onnx,
        write_preprocessing,
    )
    from vit.deploy.int8 import INT8_FILE, budget_metric, labelled_images
    from vit.eval.anomaly import ANOMALY_DIR, find_patchcore
    from vit.eval.inference import label_names
    from vit.eval.multilabel import decision_threshold
    from vit.utils.atomic import atomic_write_text

    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(args.out) if args.out else (Path(args.checkpoint) / "export" if args.checkpoint
                                           else Path("runs") / f"export-{args.model}")
    check_writable(out, "the --out folder", "pass --out with a writable folder")  # before any slow work
    if "onnx" in args.format:
        require_onnx()
    model, cfg, classes = load_model(args, overrides)
    if cfg.data.naflex is not None:  # its images are patch batches of any length, which preprocessing.json and
        # predict.py --onnx's reference preprocessing (a resize and a square crop) cannot state
        raise ConfigError("export.py writes models that read square images, and this checkpoint reads each image at "
                          "its own aspect ratio (data.naflex); run it with predict.py --checkpoint, or export it from "
                          "Python with vit.deploy.export.ExportableNaFlexClassifier (docs/naflex.md).")
    classes = classes or label_names(model, model.num_classes)
    if args.token_reduction:
        if model.dynamic_img_size:  # the merge count r depends on the token count, fixed only at a fixed size
            raise ConfigError("--token-reduction needs a fixed input size; drop --dynamic-img-size.")
        model.set_token_reduction(args.token_reduction)
    size = cfg.model.img_size
    if args.quantize:  # every input checked before the exports' slow work
        metric = budget_metric(cfg, args.int8_metric)
        data = labelled_images(cfg, classes, args.eval_images, args.calibration_images)
    x, source = verification_images(args, cfg, classes, size)
    batches = [x[:1], x]
    if model.dynamic_img_size:  # the same images at a second size, two tokens larger
        x2, _ = verification_images(args, cfg, classes, size + 2 * model.patch_embed.token_step[0])
        batches += [x2[:1], x2]
    wrapper = ExportableClassifier(model)
    model_id = fingerprint(model)
    out.mkdir(parents=True, exist_ok=True)
    print(f"verifying on {source}, batches {', '.join('x'.join(map(str, b.shape)) for b in batches)}")
    # Every file is written and checked in a staging folder; only when all pass do they take their names and
    # the sidecars follow, so a failed or interrupted export leaves the folder as it was.
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out))
    try:
        results, staged = {}, {}
        for fmt in args.format:
            staged[fmt], results[fmt] = export_verified(fmt, model, wrapper, x, batches, staging, out, model_id)
        if args.quantize:
            results["int8"] = int8(args, model, data, metric, staged["onnx"], staging, out)
            results["int8"]["model_fingerprint"] = model_id
            staged["int8"] = staging / INT8_FILE
        head = decision_threshold(cfg, args.checkpoint)  # None: single-label; a multi-label model's threshold
        info = preprocessing(model, cfg.aug, classes, threshold=head)
        anomaly = find_patchcore(args.checkpoint) if "onnx" in args.format else None
        if anomaly is not None:  # an anomaly checkpoint: its feature model and bank for predict.py --onnx
            results["anomaly"] = export_patchcore(model, anomaly, staging / ANOMALY_DIR, batches,
                                                  write_preprocessing(staging, info))
            results["anomaly"]["model_fingerprint"] = model_id
            print(f"anomaly           {out / ANOMALY_DIR}/  max |score - score_torch| = "
                  f"{results['anomaly']['max_abs_score_diff']:.1e} (<= {results['anomaly']['atol']:g}): ok")
        results = {**previous_results(out, model_id, list(results)), **results}
        for path in staged.values():
            path.replace(out / path.name)
        if anomaly is not None:
            shutil.rmtree(out / ANOMALY_DIR, ignore_errors=True)
            (staging / ANOMALY_DIR).replace(out / ANOMALY_DIR)
        write_preprocessing(out, info)
        atomic_write_text(out / "verification.json", json.dumps(dict(images=source, model_fingerprint=model_id,
                                                                     results=results), indent=1))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"wrote {out}/: {', '.join(p.name for p in staged.values())}, preprocessing.json, verification.json"
          + (f", {ANOMALY_DIR}/" if anomaly is not None else ""))
    return 0


def export_verified(fmt: str, model, wrapper, x, batches, staging: Path, out: Path, model_id: str) -> tuple[Path, dict]:
    """One format exported into `staging` and checked against the eager model on `batches`: (its staged path, its
    verification.json entry), and one line; a file that fails the check is kept in `out` as <name>.rejected."""
    from vit.deploy.export import ExportError, export_model, load_exported, verify

    t0 = time.perf_counter()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):  # the exporters' chatter
        warnings.simplefilter("ignore")
        path = export_model(wrapper, fmt, staging, x)
    seconds = time.perf_counter() - t0
    try:
        check = verify(model, load_exported(path, fmt), batches)
    except ExportError as e:
        rejected = out / f"{path.name}.rejected"
        path.replace(rejected)
        raise ExportError(f"{e} Nothing in {out} was replaced; the file is kept as {rejected}.") from None
    print(f"{fmt:<17} {out / path.name}  ({seconds:.1f} s)  max |p - p_torch| = "
          f"{check['max_abs_prob_diff']:.1e} (<= {check['atol']:g}), same top-1 on all {check['images']} "
          "rows: ok")
    return path, dict(file=str(out / path.name), export_seconds=seconds, model_fingerprint=model_id, **check)

def int8(args, model, data, metric: str, fp32: Path, staging: Path, out: Path) -> dict:
    """model.int8.onnx in `staging` (vit/deploy/int8.py) and one line of its numbers; QuantizeError (exit 2) when
    no INT8 model keeps the budget, the best attempt kept as model.int8.onnx.rejected in `out`."""
    from vit.deploy.int8 import INT8_FILE, describe_change, quantize_int8
    from vit.deploy.quantize import QuantizeError
    from vit.eval.multilabel import saved_threshold

    methods = ("dynamic", "static") if args.int8_method == "auto" else (args.int8_method,)
    threshold = saved_threshold(args.checkpoint) or 0.5  # micro_f1: the threshold training chose
    try:
        res = quantize_int8(fp32, staging / INT8_FILE, model, data, methods, metric, args.max_drop, threshold,
                            args.threads, log=print)
    except QuantizeError as e:
        rejected = staging / f"{INT8_FILE}.rejected"
        if rejected.is_file():
            rejected.replace(out / rejected.name)
        raise QuantizeError(f"{e} Nothing in {out} was replaced (the last attempt is {out / INT8_FILE}.rejected); "
                            "raise --max-drop or keep the fp32 model.onnx.") from None
    res["file"] = str(out / INT8_FILE)
    sp = res["speed"]
    print(f"int8 ({res['method']})       "
          + describe_change(metric, res[f"{metric}_fp32"], res[f"{metric}_int8"], args.max_drop, res["images"])
          + f", agrees with PyTorch on {100 * res['agreement_with_torch']:.1f}% of the images, "
          f"{len(res['float_groups'])} layer group(s) kept float; {res['bytes_fp32'] / 2**20:.1f} -> "
          f"{res['bytes_int8'] / 2**20:.1f} MiB ({res['size_ratio']:.1f}x smaller); batch 1, {args.threads} "
          f"thread(s): {sp['int8_over_eager_fp32']['median']:.2f}x PyTorch eager, "
          f"{sp['int8_over_ort_fp32']['median']:.2f}x ONNX Runtime fp32"
          + (f" (CPU time: {sp['cpu_int8_over_eager_fp32']['median']:.2f}x, "
             f"{sp['cpu_int8_over_ort_fp32']['median']:.2f}x)" if "cpu_int8_over_eager_fp32" in sp else ""))
    return res

