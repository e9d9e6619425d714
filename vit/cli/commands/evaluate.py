"""Evaluate a checkpoint: accuracy, per-class precision/recall/F1, calibration, and the images it gets wrong.

    python evaluate.py --checkpoint runs/default/best                       # its own config, classes, val split
    python evaluate.py --checkpoint runs/x/best --data.dataset=imagefolder --data.root=/data/other
    python evaluate.py --model vit_base_patch16_224 --weights vit_b16.safetensors --img-size 224 \\
        --data.dataset=imagefolder --data.root=/data/imagenet-val-as-folder
    python evaluate.py --model hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k --data.dataset=imagefolder ...
                                                   # hub weights (vit/hub/names.py); their mean/std/crop unless --aug.*
    accelerate launch --multi_gpu --num_processes 2 evaluate.py --checkpoint ...   # same numbers, one row per image
    python evaluate.py --clip hf-hub:timm/ViT-B-16-SigLIP2 --classes data/val    # zero-shot: class names from the
                                                   # folders (or --classes "cat,dog" --data-dir data/val); metrics.json

Writes to --out (default: <checkpoint>/eval): metrics.json, per_class.csv, predictions.csv, confusion.png,
reliability.png; prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    from vit.cli.args import add_model_source, add_zero_shot_inputs
    from vit.cli.help import CROP_HINT, HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter,
                                 usage="%(prog)s (--checkpoint DIR | --model NAME) [options] [--data.key=value ...]",
                                 epilog="Any --data.* or --aug.* config key may follow (train.py --help lists them), "
                                        "e.g. --data.dataset=imagefolder --data.root=/data/other; for a segmenter "
                                        "also --seg.missing_masks and --seg.window. " + CROP_HINT)
    add_model_source(ap, clip=True)  # --checkpoint | --model NAME [--pretrained | --weights FILE] | --clip NAME
    add_zero_shot_inputs(ap, ": also the images scored, unless --data-dir")  # --classes, --templates
    data = ap.add_mutually_exclusive_group()
    data.add_argument("--split", default="val",
                      help="the split of the config's data to score: val (default: the held-out split training "
                           "scored), train, or another the data has (an ImageFolder's root/<split>/<class>/*, e.g. "
                           "test; a labels file's split column; a shard or Hugging Face split)")
    data.add_argument("--data-dir", default=None, metavar="FOLDER",
                      help="score this folder of <class>/ image folders instead (its class names must be the model's; "
                           "a segmentation checkpoint: images/ + masks/, or a CSV of pairs)")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="images per batch (default: the config's data.eval_batch_size, else data.batch_size; a "
                         "segmenter reads one image at a time, as predict.py does)")
    ap.add_argument("--topk", type=int, default=5, help="predictions per row in predictions.csv")
    ap.add_argument("--token-reduction", default=None, metavar="SPEC",
                    help="evaluate with token reduction, e.g. merge:8 (ToMe) or topk:0.7@3,6,9; 'none' turns off "
                         "the checkpoint's own (default: the checkpoint's setting)")
    ap.add_argument("--threshold", type=float, default=None,
                    help="multi-label: the probability from which a class is predicted (default: the one training "
                         "chose on its validation split, saved in the checkpoint; else the best on this data)")
    ap.add_argument("--sparse-attention", default=None, metavar="SPEC",
                    help="evaluate with sparse attention METHOD[:DENSITY][:SELECT], e.g. moba:0.25 or "
                         "dsa:0.125:block (dsa needs a checkpoint trained with it); 'none' attends densely "
                         "(default: the checkpoint's setting)")
    ap.add_argument("--out", default=None, help="output folder (default: <checkpoint>/eval or runs/eval-<model>)")
    return ap


def parse_args(argv):
    from vit.cli.args import parse_command
    from vit.config import ConfigError

    args, overrides = parse_command(build_parser(), argv, "evaluate.py",
                                    ("data.", "aug.", "seg.missing_masks", "seg.window"),
                                    ("topk", "batch_size", "img_size"))
    if args.threshold is not None and not 0 < args.threshold < 1:
        raise ConfigError(f"--threshold must be between 0 and 1 (a probability), got {args.threshold}.")
    return args, overrides


def main(argv=None) -> int:
    from vit.cli.args import load_model
    from vit.cli.outputs import OutputLock, check_writable
    from vit.config import ConfigError, check_dataset_keys

    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    if args.clip:
        return main_zero_shot(args)
    out_dir = Path(args.out) if args.out else (Path(args.checkpoint) / "eval" if args.checkpoint
                                                 else Path("runs") / f"eval-{args.model}")
    check_writable(out_dir)  # before the model loads or an image is read
    model, cfg, ckpt_classes = load_model(args, overrides)  # (a missing checkpoint: before its eval/)
    check_dataset_keys(cfg, list(overrides))  # e.g. --data.val_split=test for a folder: refused, not ignored
    if args.threshold is not None and not cfg.data.labels_file:
        per = "pixel" if cfg.data.dataset == "segmentation" else "image"
        raise ConfigError("--threshold is for multi-label models (trained with data.labels_file); this one picks "
                          f"one class per {per}.")
    with OutputLock(out_dir, hold=os.environ.get("RANK", "0") == "0"):  # one evaluation per --out at a time
        if cfg.data.dataset == "segmentation":  # a class per pixel: mIoU, per-class IoU, Dice (docs/segmentation.md)
            return _evaluate_segmentation(args, out_dir, model, cfg, ckpt_classes)
        return _evaluate(args, overrides, out_dir, model, cfg, ckpt_classes)


def main_zero_shot(args) -> int:
    """--clip: zero-shot top-1 accuracy on a folder of <class>/ images, written to --out/metrics.json."""
    from vit.cli.outputs import check_writable
    from vit.config import ConfigError
    from vit.eval.zero_shot import evaluate_zero_shot
    from vit.utils.atomic import atomic_write_text

    if not args.classes:
        raise ConfigError("--clip needs --classes: a folder of class subfolders, a file of names or 'cat,dog'.")
    folder = args.data_dir or args.classes
    if not os.path.isdir(folder):  # False, not OSError, for names too long to be a path
        raise ConfigError(f"--clip scores a folder of <class>/ images: pass --data-dir FOLDER (not {folder!r:.60}).")
    out_dir = Path(args.out or Path("runs") / "eval-zero-shot")
    check_writable(out_dir)
    result = evaluate_zero_shot(args.clip, args.classes, folder, args.templates, args.batch_size or 64)
    metrics = {k: result[k] for k in ("accuracy", "count", "chance", "classes")}
    atomic_write_text(out_dir / "metrics.json", json.dumps(dict(metrics, model=args.clip), indent=2))
    print(f"zero-shot top-1 {100 * result['accuracy']:.2f}% on {result['count']} images "
          f"({len(result['classes'])} classes, chance {100 * result['chance']:.1f}%) -> {out_dir}/metrics.json")
    return 0


def _evaluate(args, overrides, out_dir: Path, model, cfg, ckpt_classes) -> int:
    from vit.cli.runtime import make_accelerator, resolve_workers
    from vit.eval.evaluate import eval_data, evaluate_model

    # the class check happens here, before any image is decoded or any forward pass runs
    val_ds, classes, scored = eval_data(model, cfg, ckpt_classes, args.split, args.data_dir, args.token_reduction,
                                        args.sparse_attention)  # a bad spec: one sentence, exit 2 (run_cli)
    print(f"scoring {scored}")
    result = evaluate_model(model, cfg, val_ds, classes, scored, batch_size=args.batch_size,
                            num_workers=resolve_workers(cfg.data.num_workers), topk=args.topk,
                            threshold=args.threshold, checkpoint=args.checkpoint, weights=args.weights,
                            sparse_attention=args.sparse_attention, out_dir=out_dir, accelerator=make_accelerator())
    if result is None:  # not the main process
        return 0
    if cfg.data.labels_file:
        _print_multilabel(result.metrics, result.per_class, out_dir)
    else:
        _print_report(result.metrics, val_ds, classes, result.per_class, result.averages, out_dir, result.gallery)
    return 0


def _evaluate_segmentation(args, out_dir: Path, model, cfg, classes) -> int:
    from vit.eval.segmentation import evaluate_segmentation
    from vit.utils.untrusted_text import printable

    m = evaluate_segmentation(model, cfg, classes, args.split, out_dir, folder=args.data_dir,
                              log=lambda line: print(printable(line), flush=True))
    if m["skipped"]:
        print(f"skipped {len(m['skipped'])} unreadable image(s) (data.on_bad_image=skip): "
              + "; ".join(printable(b) for b in m["skipped"][:5]))
    print(f"{m['images']} images, {m['pixels']} pixels scored: mIoU {100 * m['miou']:.2f}%   mean Dice "
          f"{100 * m['mdice']:.2f}%   pixel accuracy {100 * m['pixel_acc']:.2f}%\n")
    width = max(len("class"), *(len(printable(c)) for c in classes)) + 2
    print(f"{'class':<{width}}{'IoU':>10}{'Dice':>10}")
    for c in classes:
        print(f"{printable(c):<{width}}{m['iou'][c]:>10.4f}{m['dice'][c]:>10.4f}")
    print(f"\nwrote {out_dir}/: metrics.json per_class.csv")
    return 0


def _print_report(metrics: dict, val_ds, classes, rows, avgs, out_dir: Path, gallery: bool) -> None:
    """The console report: speed, skipped images, top-1/top-5/loss/ECE, the per-class table, the files written."""
    from vit.utils.untrusted_text import printable

    n, num_processes, ece = metrics["n"], metrics["num_processes"], metrics["ece"]
    print(f"\n{n} images, {num_processes} process(es), {metrics['images_per_s']:.0f} images/s")
    if metrics["skipped"]:
        bad = getattr(val_ds, "bad", [])  # a folder's, found before evaluating; shards name theirs as read
        names = "; ".join(printable(b) for b in bad[:5]) + (f" ... and {len(bad) - 5} more" if len(bad) > 5 else "")
        print(f"skipped {metrics['skipped']} unreadable image(s)" + (f": {names}" if names else
                                                                      ", named in the warnings above"))
    top5 = f"   top-5 {100 * metrics['top5']:.2f}%" if metrics["top5"] is not None else ""
    print(f"top-1 {100 * metrics['top1']:.2f}%{top5}   loss {metrics['loss']:.4f}   ECE {ece:.4f}\n")
    shown = [printable(c) for c in classes]  # a class name's escape sequences are shown, not obeyed
    width = max(len("weighted avg") + 2, max(len(c) for c in shown) + 2)  # the average rows align too
    print(f"{'class':<{width}}{'precision':>10}{'recall':>10}{'f1':>10}{'support':>10}")
    for c, r in zip(shown, rows):
        print(f"{c:<{width}}{r['precision']:>10.4f}{r['recall']:>10.4f}{r['f1']:>10.4f}{r['support']:>10d}")
    for name in ("macro", "weighted"):
        a = avgs[name]
        print(f"{name + ' avg':<{width}}{a['precision']:>10.4f}{a['recall']:>10.4f}{a['f1']:>10.4f}{n:>10d}")
    print(f"\nwrote {out_dir}/: metrics.json per_class.csv predictions.csv confusion.png reliability.png"
          + (" mistakes.png" if gallery else ""))


def _print_multilabel(metrics: dict, per_class: list[dict], out_dir: Path) -> None:
    """The multi-label report: mAP, loss, micro F1 at the threshold (and the best here), the per-class table."""
    from vit.utils.untrusted_text import printable

    m = metrics
    print(f"\n{m['n']} images, {m['num_processes']} process(es), {m['images_per_s']:.0f} images/s")
    print(f"mAP {100 * m['map']:.2f}%   loss {m['loss']:.4f}   micro F1 {m['micro_f1']:.4f} at threshold "
          f"{m['threshold']:.2f} ({m['threshold_from']}; the best here: {m['best_micro_f1_here']:.4f} at "
          f"{m['best_threshold_here']:.2f})\n")
    shown = [printable(r["class"]) for r in per_class]  # a class name's escape sequences are shown, not obeyed
    width = max(len("class") + 2, max(len(c) for c in shown) + 2)
    print(f"{'class':<{width}}{'AP':>10}{'precision':>10}{'recall':>10}{'f1':>10}{'support':>10}")
    for c, r in zip(shown, per_class):
        print(f"{c:<{width}}{r['ap']:>10.4f}{r['precision']:>10.4f}{r['recall']:>10.4f}{r['f1']:>10.4f}"
              f"{r['support']:>10d}")
    print(f"\nwrote {out_dir}/: metrics.json per_class.csv predictions.csv")
