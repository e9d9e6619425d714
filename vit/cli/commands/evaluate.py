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
import time
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    from vit.cli.args import add_model_source, add_zero_shot_inputs
    from vit.cli.help import CROP_HINT, HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter,
                                 usage="%(prog)s (--checkpoint DIR | --model NAME) [options] [--data.key=value ...]",
                                 epilog="Any --data.* or --aug.* config key may follow (train.py --help lists them), "
                                        "e.g. --data.dataset=imagefolder --data.root=/data/other. " + CROP_HINT)
    add_model_source(ap, clip=True)  # --checkpoint | --model NAME [--pretrained | --weights FILE] | --clip NAME
    add_zero_shot_inputs(ap, ": also the images scored, unless --data-dir")  # --classes, --templates
    data = ap.add_mutually_exclusive_group()
    data.add_argument("--split", default="val",
                      help="the split of the config's data to score: val (default: the held-out split training "
                           "scored), train, or another the data has (an ImageFolder's root/<split>/<class>/*, e.g. "
                           "test; a labels file's split column; a shard or Hugging Face split)")
    data.add_argument("--data-dir", default=None, metavar="FOLDER",
                      help="score this folder of <class>/ image folders instead (its class names must be the model's)")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="images per batch (default: the config's data.eval_batch_size, else data.batch_size)")
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


class Indexed:
    """Yields (image, label, index) so predictions can be matched to their sample after gathering (a map-style
    dataset for DataLoader: __len__ and __getitem__)."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        x, y = self.ds[i]
        return x, y, i


def parse_args(argv):
    from vit.cli.args import parse_command
    from vit.config import ConfigError

    args, overrides = parse_command(build_parser(), argv, "evaluate.py", ("data.", "aug."),
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
        raise ConfigError("--threshold is for multi-label models (trained with data.labels_file); this one picks "
                          "one class per image.")
    with OutputLock(out_dir, hold=os.environ.get("RANK", "0") == "0"):  # one evaluation per --out at a time
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
    from vit.cli.runtime import make_accelerator
    from vit.config import to_dict
    from vit.data import DataError, build_eval_split
    from vit.eval.metrics import expected_calibration_error, per_class_metrics, predict, summarize_logits
    from vit.eval.plots import plot_confusion, plot_reliability
    from vit.utils.atomic import atomic_write_csv, atomic_write_text

    if args.token_reduction is not None:
        model.set_token_reduction(args.token_reduction)  # a bad spec: one sentence, exit 2 (run_cli)
        cfg.model.token_reduction = args.token_reduction
    if args.sparse_attention is not None:
        model.set_sparse_attention(args.sparse_attention)  # a bad spec: one sentence, exit 2 (run_cli)
    # the class check happens here, before any image is decoded or any forward pass runs
    val_ds, classes, scored = build_eval_split(cfg, args.split, args.data_dir, ckpt_classes)
    print(f"scoring {scored}")
    if ckpt_classes is None and len(classes) != model.num_classes:
        raise DataError(f"the weights classify {model.num_classes} classes but the dataset has {len(classes)}; "
                        "evaluate on data with the classes the model was trained on.")
    accelerator = make_accelerator()
    model, loader = _prepared(accelerator, model, val_ds, cfg, args.batch_size)
    t0 = time.perf_counter()
    out = predict(model, loader, accelerator)  # one row per sample, in dataset order
    seconds = time.perf_counter() - t0
    logits, labels, index = out["logits"], out["labels"], out["index"]
    num_processes, is_main = accelerator.num_processes, accelerator.is_main_process
    # that was the last collective: close the process group on every rank now, so that a rank leaving early
    # does not tear gloo's threads down under the others (std::terminate, SIGABRT, the run killed)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    if not is_main:
        return 0

    if cfg.data.labels_file:
        return report_multilabel(args, cfg, val_ds, classes, out, out_dir, num_processes, seconds, scored)
    n, k = len(labels), len(classes)
    if hasattr(val_ds, "check_seen"):  # shards given with a count (after '|') that may be wrong
        val_ds.check_seen(n + out.get("skipped", 0))
    summary = summarize_logits(logits, labels)
    probs = logits.softmax(1)
    ece, bins = expected_calibration_error(probs, labels)
    pred = logits.argmax(1)
    conf, rows, avgs = per_class_metrics(labels.numpy(), pred.numpy(), k)
    metrics = dict(n=n, top1=summary["acc1"], top5=summary.get("acc5"), loss=summary["loss"], ece=ece,
                   images_per_s=n / max(seconds, 1e-9), macro=avgs["macro"], weighted=avgs["weighted"],
                   classes=classes, checkpoint=args.checkpoint or args.weights, dataset=cfg.data.dataset, data=scored,
                   token_reduction=cfg.model.token_reduction,
                   sparse_attention=args.sparse_attention or to_dict(cfg.model)["sparse_attention"],
                   num_processes=num_processes, skipped=len(getattr(val_ds, "bad", ())) + out.get("skipped", 0))

    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "metrics.json", json.dumps(metrics, indent=1))
    atomic_write_csv(out_dir / "per_class.csv", ["class", "precision", "recall", "f1", "support"],
                     [{"class": c, **r} for c, r in zip(classes, rows)])
    pred_rows = _prediction_rows(val_ds, classes, probs, labels, index, min(args.topk, k))
    atomic_write_csv(out_dir / "predictions.csv", list(pred_rows[0]) if pred_rows else ["sample"], pred_rows)
    plot_confusion(conf, classes, out_dir / "confusion.png")
    plot_reliability(bins, ece, out_dir / "reliability.png")
    text = cfg.data.dataset == "text_csv"  # no pictures of sentences
    gallery = not text and plot_gallery(val_ds, cfg, classes, probs, labels, index, out_dir / "mistakes.png")
    _print_report(metrics, val_ds, classes, rows, avgs, out_dir, gallery)
    return 0


def _prepared(accelerator, model, val_ds, cfg, batch_size: int | None):
    """(model, loader) prepared by Accelerate; shards are dealt to processes by their own loader."""
    from torch.utils.data import DataLoader

    from vit.cli.runtime import resolve_workers

    batch_size = batch_size or cfg.data.eval_batch_size or cfg.data.batch_size
    if cfg.data.dataset == "wds":  # the loader deals shards to processes itself (vit/data/shard_loader.py)
        from vit.data.shard_loader import ShardLoader

        loader = ShardLoader(val_ds, batch_size, resolve_workers(cfg.data.num_workers), accelerator.process_index,
                             accelerator.num_processes, accelerator.device)
        return accelerator.prepare(model), loader
    loader = DataLoader(Indexed(val_ds), batch_size=batch_size, shuffle=False,
                        num_workers=resolve_workers(cfg.data.num_workers),
                        collate_fn=getattr(val_ds, "collate", None))  # text: padded per batch
    return accelerator.prepare(model, loader)


def _prediction_rows(val_ds, classes, probs, labels, index, topk: int) -> list[dict]:
    """predictions.csv: one row per sample, its label and the `topk` classes with their probabilities."""
    p_top, i_top = probs.topk(topk, dim=1)
    pred_rows = []
    for j in range(len(labels)):
        i = int(index[j])
        row = {"sample": val_ds.describe(i), "label": int(labels[j]), "label_name": classes[int(labels[j])],
               "correct": int(i_top[j, 0] == labels[j])}
        for r in range(topk):
            row[f"pred{r + 1}"] = int(i_top[j, r])
            row[f"pred{r + 1}_name"] = classes[int(i_top[j, r])]
            row[f"prob{r + 1}"] = f"{float(p_top[j, r]):.6f}"
        pred_rows.append(row)
    return pred_rows


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


MISTAKES = 16  # images in mistakes.png


def plot_gallery(val_ds, cfg, classes, probs, labels, index, path: Path) -> bool:
    """mistakes.png: the MISTAKES most confident misclassified images as the model saw them, each with its true
    class, the prediction and its probability. Data read as a stream (shards) cannot be revisited: none."""
    from vit.eval.metrics import worst_mistakes
    from vit.eval.plots import plot_mistakes, to_display

    images, titles = [], []
    for j in worst_mistakes(probs, labels, MISTAKES):
        i = int(index[j])
        try:
            x = val_ds[i][0]
        except (TypeError, NotImplementedError):  # an IterableDataset
            return False
        if isinstance(x, dict):  # NaFlex patches: the picture at its own aspect ratio
            from vit.data.naflex import unpatchify

            x = unpatchify(x, cfg.model.patch_size)
        p, y = probs[j].max(0), int(labels[j])
        name = Path(val_ds.describe(i)).name
        images.append(to_display(x, cfg.aug.mean, cfg.aug.std))
        titles.append(f"{name[:22]}\ntrue {classes[y]}\npredicted {classes[int(p.indices)]} "
                      f"{100 * float(p.values):.0f}%")
    plot_mistakes(images, titles, path)
    return True


def report_multilabel(args, cfg, val_ds, classes, out: dict, out_dir: Path, num_processes: int,
                      seconds: float, scored: str) -> int:
    """The multi-label report: per-class average precision, mAP, and precision/recall/F1 at the threshold
    (--threshold, else training's, else the best on this split, which is reported beside it)."""
    from vit.eval.multilabel import labels_above, saved_threshold, summarize_multilabel
    from vit.utils.atomic import atomic_write_csv, atomic_write_text
    from vit.utils.untrusted_text import printable

    logits, targets, index = out["logits"], out["labels"], out["index"]
    best = summarize_multilabel(logits, targets)  # threshold chosen on this data
    given = args.threshold if args.threshold is not None else saved_threshold(args.checkpoint)
    m = summarize_multilabel(logits, targets, given) if given is not None else best
    source = "--threshold" if args.threshold is not None else "training's validation split" if given else "this data"
    metrics = dict(n=m["n"], map=m["map"], loss=m["loss"], threshold=m["threshold"], threshold_from=source,
                   micro_f1=m["micro_f1"], micro_precision=m["micro_precision"], micro_recall=m["micro_recall"],
                   macro_f1=m["macro_f1"], best_threshold_here=best["threshold"], best_micro_f1_here=best["micro_f1"],
                   images_per_s=m["n"] / max(seconds, 1e-9), classes=classes,
                   checkpoint=args.checkpoint or args.weights,
                   dataset=cfg.data.dataset, data=scored, labels_file=cfg.data.labels_file,
                   num_processes=num_processes)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "metrics.json", json.dumps(metrics, indent=1))
    per_class = [dict(**{"class": c}, ap=m["ap"][i], precision=m["precision"][i], recall=m["recall"][i],
                      f1=m["f1"][i], support=int(m["support"][i])) for i, c in enumerate(classes)]
    atomic_write_csv(out_dir / "per_class.csv", ["class", "ap", "precision", "recall", "f1", "support"], per_class)
    probs = logits.float().sigmoid()
    predicted, true = labels_above(probs, classes, m["threshold"]), labels_above(targets, classes, 0.5)
    rows = [{"sample": val_ds.describe(int(index[j])), "labels": true[j], "predicted": predicted[j],
             **{f"prob_{c}": f"{float(probs[j, i]):.6f}" for i, c in enumerate(classes)}} for j in range(len(index))]
    atomic_write_csv(out_dir / "predictions.csv", list(rows[0]) if rows else ["sample"], rows)

    print(f"\n{m['n']} images, {num_processes} process(es), {metrics['images_per_s']:.0f} images/s")
    print(f"mAP {100 * m['map']:.2f}%   loss {m['loss']:.4f}   micro F1 {m['micro_f1']:.4f} at threshold "
          f"{m['threshold']:.2f} ({source}; the best here: {best['micro_f1']:.4f} at {best['threshold']:.2f})\n")
    shown = [printable(c) for c in classes]  # a class name's escape sequences are shown, not obeyed
    width = max(len("class") + 2, max(len(c) for c in shown) + 2)
    print(f"{'class':<{width}}{'AP':>10}{'precision':>10}{'recall':>10}{'f1':>10}{'support':>10}")
    for c, r in zip(shown, per_class):
        print(f"{c:<{width}}{r['ap']:>10.4f}{r['precision']:>10.4f}{r['recall']:>10.4f}{r['f1']:>10.4f}"
              f"{r['support']:>10d}")
    print(f"\nwrote {out_dir}/: metrics.json per_class.csv predictions.csv")
    return 0

