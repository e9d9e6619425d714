"""Export a classifier to ONNX, OpenVINO IR, TorchScript or a torch.export program, checked against PyTorch on real
images.

    python export.py --checkpoint runs/default/best --format onnx --out exported/
    python export.py --checkpoint runs/default/best --format openvino --quantize int8 --out exported/
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
the export extra: pip install -e '.[export]'. --format openvino also writes the verified ONNX file converted to
OpenVINO IR (model.xml + model.bin, fp32), checked the same way on OpenVINO's CPU runtime (an anomaly checkpoint's
feature model too: anomaly/features.xml), for predict.py --openvino; with --quantize int8 also model.int8.xml,
NNCF's post-training INT8 within the same --max-drop budget; it needs the openvino extra: pip install -e
'.[openvino]'. A segmentation checkpoint exports to ONNX alone: segmenter.onnx and
segmentation.json (docs/segmentation.md), and with --quantize int8 segmenter.int8.onnx within an mIoU budget.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# vit.deploy.export.FORMATS's keys (tests check they agree), named here so that --help needs no torch
EXPORT_FORMATS = ("onnx", "openvino", "torchscript", "exported-program")


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
    ap.add_argument("--detector", metavar="NAME", default=None,
                    help="--checkpoint: which of its anomaly detectors goes into anomaly/ (<checkpoint>/anomaly/NAME/, "
                         "anomaly.py fit --detector NAME; default: <checkpoint>/anomaly/ itself)")
    q = ap.add_argument_group("INT8 (ONNX Runtime, and NNCF for OpenVINO; docs in vit/deploy/quantize.py and "
                              "openvino_int8.py)")
    q.add_argument("--quantize", choices=("int8",), default=None,
                   help="also write model.int8.onnx (and with --format openvino model.int8.xml by NNCF), each "
                        "within --max-drop (implies --format onnx)")
    q.add_argument("--int8-method", choices=("auto", "dynamic", "static"), default="auto",
                   help="dynamic: weights only; static: QDQ with activations calibrated on training images; "
                        "auto: both, the faster one that keeps the budget")
    q.add_argument("--max-drop", "--max-top1-drop", dest="max_drop", type=float, default=0.5,
                   help="points of --int8-metric INT8 may lose against the fp32 export on the evaluation images "
                        "(a gain always passes)")
    q.add_argument("--int8-metric", choices=("top1", "map", "micro_f1", "miou"), default=None,
                   help="what the budget measures (default: top1; mAP for a multi-label checkpoint, micro_f1 at "
                        "its threshold on request; mIoU, the only one, for a segmentation checkpoint)")
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
    if (args.quantize or "openvino" in args.format) and "onnx" not in args.format:
        args.format.insert(0, "onnx")  # INT8 and OpenVINO IR are made from the verified fp32 ONNX file
    if not 0 <= args.max_drop <= 100 or args.max_drop != args.max_drop:
        raise ConfigError(f"--max-drop is in points of the metric, between 0 and 100; got {args.max_drop}.")
    if args.quantize and not (args.checkpoint or args.eval_images):
        raise ConfigError("--quantize needs labelled images to keep its budget: pass --checkpoint (its "
                          "validation split) or --eval-images FOLDER (class subfolders).")
    if args.quantize and args.eval_images and not Path(args.eval_images).is_dir():
        raise ConfigError(f"--eval-images {args.eval_images} is not a folder; pass a folder of <class>/<image>.")
    return args, overrides


def main(argv=None) -> int:
    from vit.cli.args import load_model
    from vit.cli.images import collect_images
    from vit.cli.outputs import check_writable
    from vit.deploy.export import require_onnx
    from vit.deploy.export_folder import Int8Request, export_folder
    from vit.deploy.openvino_ir import require_openvino
    from vit.eval.inference import label_names

    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(args.out) if args.out else (Path(args.checkpoint) / "export" if args.checkpoint
                                           else Path("runs") / f"export-{args.model}")
    check_writable(out, "the --out folder", "pass --out with a writable folder")  # before any slow work
    if args.detector is not None:  # a name the checkpoint does not hold is one sentence before the model loads
        from vit.eval.anomaly_settings import detector_folder

        if not args.checkpoint:
            raise ValueError("--detector names one of a --checkpoint's anomaly detectors (<checkpoint>/anomaly/NAME/);"
                             " pass --checkpoint.")
        detector_folder(args.checkpoint, args.detector)
    if "onnx" in args.format:
        require_onnx()
    if "openvino" in args.format:
        require_openvino("export.py --format openvino")
    model, cfg, classes = load_model(args, overrides)
    if cfg.data.dataset == "segmentation":
        return _export_segmenter(args, model, cfg, classes, out)
    classes = classes or label_names(model, model.num_classes)
    int8 = Int8Request(args.int8_method, args.max_drop, args.int8_metric, args.eval_images, args.calibration_images,
                       args.threads) if args.quantize else None
    paths = collect_images(args.images)[0] if args.images else None
    export_folder(model, cfg, classes, out, args.format, paths=paths, checkpoint=args.checkpoint,
                  token_reduction=args.token_reduction, int8=int8, detector=args.detector)
    return 0


def _export_segmenter(args, model, cfg, classes, out: Path) -> int:
    """A segmentation checkpoint: segmenter.onnx + segmentation.json, checked on up to 4 of its validation images
    (vit/deploy/onnx_segment.py; vit.deploy.onnx_segment.OnnxSegmenter reads them without torch); with --quantize
    int8 also segmenter.int8.onnx within --max-drop points of mIoU on the validation split (calibrated on training
    images as evaluation reads them), its numbers added to segmentation.json."""
    import torch

    from vit.config import ConfigError
    from vit.data.segmentation import build_seg_datasets
    from vit.deploy.onnx_segment import export_segmenter

    if cfg.data.naflex is not None:
        raise ConfigError("a NaFlex segmentation checkpoint (data.naflex) has no export yet, ONNX or other (its graph "
                          "would take each image's own patch grid); predict.py --checkpoint and demo.py read it.")
    if list(args.format) != ["onnx"] or args.eval_images or args.images or args.int8_metric not in (None, "miou"):
        raise ConfigError("a segmentation checkpoint exports to ONNX only (--format onnx), checked and, with "
                          "--quantize, measured by mIoU on its own validation split (no --images, --eval-images or "
                          "other --int8-metric).")
    splits = ("train", "val") if args.quantize else ("val",)
    train, val, _ = build_seg_datasets(cfg, splits, classes, augment=False)  # calibrated on unaugmented images
    batch = torch.stack([val[i][0] for i in range(min(4, len(val)))])
    check = export_segmenter(model, out, cfg, classes, [batch])
    print(f"wrote {out}/segmenter.onnx and segmentation.json: logits within {check['max_abs_logit_diff']:.1e} of "
          f"PyTorch's, {check['pixels_differing']} pixel(s) of another class")
    if args.quantize:
        _quantize_segmenter(args, model, train, val, out)
    return 0


def _quantize_segmenter(args, model, train, val, out: Path) -> None:
    """segmenter.int8.onnx by vit/deploy/int8.py's quantize_int8 with the mIoU budget; its numbers in
    segmentation.json (written atomically), or one sentence (exit 2) when no INT8 model keeps the budget."""
    import json

    import numpy as np

    from vit.deploy.int8 import LabelledImages, describe_change, quantize_int8
    from vit.deploy.onnx_segment import SEG_SETTINGS, SEGMENTER_INT8, SEGMENTER_ONNX
    from vit.utils.atomic import atomic_write_text

    x, y = (np.stack([np.asarray(val[i][k]) for i in range(len(val))]) for k in (0, 1))
    calib = np.stack([np.asarray(train[i][0]) for i in range(min(args.calibration_images, len(train)))])
    data = LabelledImages(x.astype(np.float32), y, calib.astype(np.float32), f"the validation split ({len(x)} images)")
    methods = ("dynamic", "static") if args.int8_method == "auto" else (args.int8_method,)
    res = quantize_int8(out / SEGMENTER_ONNX, out / SEGMENTER_INT8, model.eval(), data, methods, "miou",
                        args.max_drop, threads=args.threads)
    print(f"int8 ({res['method']})       " + describe_change("miou", res["miou_fp32"], res["miou_int8"],
                                                             args.max_drop, res["images"])
          + f"; {res['size_ratio']:.1f}x smaller: {out}/{SEGMENTER_INT8}")
    settings = json.loads((out / SEG_SETTINGS).read_text())
    settings["int8"] = {k: res[k] for k in ("method", "miou_fp32", "miou_int8", "drop_points", "max_drop",
                                            "images", "calibration_images", "size_ratio")}
    atomic_write_text(out / SEG_SETTINGS, json.dumps(settings, indent=1))

