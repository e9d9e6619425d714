"""Scoring a classifier on labelled data: accuracy, per-class precision / recall / F1, calibration and the most
confident mistakes (a multi-label model: per-class AP, mAP and F1 at a threshold); what evaluate.py runs.

    metrics = evaluate_checkpoint("runs/default/best")                     # its own config, classes, val split
    metrics = evaluate_checkpoint("runs/x/best", data_dir="/data/other", out_dir=Path("eval"))  # + the files

evaluate.py's files (metrics.json, per_class.csv, predictions.csv, confusion.png, reliability.png, mistakes.png)
are written by `evaluate_model` when given a folder; the console report is the command's.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from ..config import to_dict
from ..data import DataError, build_eval_split
from ..utils.atomic import atomic_write_csv, atomic_write_text
from .metrics import (
    end_processes,
    expected_calibration_error,
    per_class_metrics,
    predict,
    summarize_logits,
    worst_mistakes,
)
from .multilabel import labels_above, saved_threshold, summarize_multilabel

__all__ = ["Evaluation", "eval_data", "evaluate_model", "evaluate_checkpoint", "MISTAKES"]

MISTAKES = 16  # images in mistakes.png


@dataclass
class Evaluation:
    """What an evaluation found: metrics.json's dict, per_class.csv's rows, the macro / weighted averages
    (single-label), the dataset scored (its `bad` images, `describe`) and whether mistakes.png was drawn."""

    metrics: dict
    per_class: list[dict]
    averages: dict | None
    dataset: object
    gallery: bool = False


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


def eval_data(model, cfg, classes: list[str] | None = None, split: str = "val", data_dir: str | None = None,
              token_reduction: str | None = None, sparse_attention: str | None = None):
    """(dataset, class names, what is scored, in words) of `cfg`'s `split` or of the class folders in
    `data_dir`, after setting the model's token reduction / sparse attention (None: the checkpoint's own); a
    dataset whose classes the model cannot score is one sentence (DataError), before any image is decoded."""
    if token_reduction is not None:
        model.set_token_reduction(token_reduction)
        cfg.model.token_reduction = token_reduction
    if sparse_attention is not None:
        model.set_sparse_attention(sparse_attention)
    val_ds, found, scored = build_eval_split(cfg, split, data_dir, classes)
    if classes is None and len(found) != model.num_classes:
        raise DataError(f"the weights classify {model.num_classes} classes but the dataset has {len(found)}; "
                        "evaluate on data with the classes the model was trained on.")
    return val_ds, found, scored


def _loader(accelerator, model, val_ds, cfg, batch_size: int | None, workers: int):
    """(model, loader) prepared by Accelerate; shards are dealt to processes by their own loader."""
    from torch.utils.data import DataLoader

    batch_size = batch_size or cfg.data.eval_batch_size or cfg.data.batch_size
    if cfg.data.dataset == "wds":  # the loader deals shards to processes itself (vit/data/shard_loader.py)
        from ..data.shard_loader import ShardLoader

        loader = ShardLoader(val_ds, batch_size, workers, accelerator.process_index, accelerator.num_processes,
                             accelerator.device)
        return accelerator.prepare(model), loader
    loader = DataLoader(Indexed(val_ds), batch_size=batch_size, shuffle=False, num_workers=workers,
                        collate_fn=getattr(val_ds, "collate", None))  # text: padded per batch
    return accelerator.prepare(model, loader)


def evaluate_model(model, cfg, val_ds, classes: list[str], scored: str = "", *, batch_size: int | None = None,
                   num_workers: int = 0, topk: int = 5, threshold: float | None = None,
                   checkpoint: str | Path | None = None, weights: str | Path | None = None,
                   sparse_attention: str | None = None, out_dir: Path | None = None,
                   accelerator=None) -> Evaluation | None:
    """`model` scored on `val_ds` (eval_data's), one prediction per sample gathered over `accelerator`'s
    processes (default: a new Accelerator; its process group is closed after, the last collective, and every
    process but the main one gets None). With `out_dir`, evaluate.py's files are written there. `threshold`
    (multi-label): the probability from which a class is predicted, else training's (saved in `checkpoint`), else
    the best on this data; `checkpoint` / `weights` / `sparse_attention` are recorded in the metrics."""
    if accelerator is None:
        from accelerate import Accelerator

        accelerator = Accelerator()
    model, loader = _loader(accelerator, model, val_ds, cfg, batch_size, num_workers)
    t0 = time.perf_counter()
    out = predict(model, loader, accelerator)  # one row per sample, in dataset order
    seconds = time.perf_counter() - t0
    num_processes = accelerator.num_processes
    if not end_processes(accelerator):
        return None
    record = dict(images_per_s=len(out["labels"]) / max(seconds, 1e-9), classes=classes,
                  checkpoint=str(checkpoint or weights) if checkpoint or weights else None,
                  dataset=cfg.data.dataset, data=scored)
    if cfg.data.labels_file:
        result = _multilabel(out, cfg, val_ds, classes, threshold, checkpoint, out_dir)
        result.metrics.update(record, labels_file=cfg.data.labels_file, num_processes=num_processes)
    else:
        if hasattr(val_ds, "check_seen"):  # shards given with a count (after '|') that may be wrong
            val_ds.check_seen(len(out["labels"]) + out.get("skipped", 0))
        result = _single_label(out, cfg, val_ds, classes, topk, out_dir)
        result.metrics.update(record, token_reduction=cfg.model.token_reduction,
                              sparse_attention=sparse_attention or to_dict(cfg.model)["sparse_attention"],
                              num_processes=num_processes,
                              skipped=len(getattr(val_ds, "bad", ())) + out.get("skipped", 0))
    if out_dir is not None:
        atomic_write_text(Path(out_dir) / "metrics.json", json.dumps(result.metrics, indent=1))
    return result


def _single_label(out: dict, cfg, val_ds, classes: list[str], topk: int, out_dir: Path | None) -> Evaluation:
    """Top-1 / top-5, loss, ECE and the per-class table of softmax predictions; with `out_dir`, the files."""
    from .plots import plot_confusion, plot_reliability

    logits, labels, index = out["logits"], out["labels"], out["index"]
    summary = summarize_logits(logits, labels)
    probs = logits.softmax(1)
    ece, bins = expected_calibration_error(probs, labels)
    conf, rows, avgs = per_class_metrics(labels.numpy(), logits.argmax(1).numpy(), len(classes))
    metrics = dict(n=len(labels), top1=summary["acc1"], top5=summary.get("acc5"), loss=summary["loss"], ece=ece,
                   images_per_s=None, macro=avgs["macro"], weighted=avgs["weighted"])  # images_per_s: the caller's
    per_class = [{"class": c, **r} for c, r in zip(classes, rows)]
    result = Evaluation(metrics, per_class, avgs, val_ds)
    if out_dir is None:
        return result
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_csv(out_dir / "per_class.csv", ["class", "precision", "recall", "f1", "support"], per_class)
    pred_rows = prediction_rows(val_ds, classes, probs, labels, index, min(topk, len(classes)))
    atomic_write_csv(out_dir / "predictions.csv", list(pred_rows[0]) if pred_rows else ["sample"], pred_rows)
    plot_confusion(conf, classes, out_dir / "confusion.png")
    plot_reliability(bins, ece, out_dir / "reliability.png")
    text = cfg.data.dataset == "text_csv"  # no pictures of sentences
    result.gallery = not text and plot_gallery(val_ds, cfg, classes, probs, labels, index, out_dir / "mistakes.png")
    return result


def prediction_rows(val_ds, classes, probs, labels, index, topk: int) -> list[dict]:
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


def plot_gallery(val_ds, cfg, classes, probs, labels, index, path: Path) -> bool:
    """mistakes.png: the MISTAKES most confident misclassified images as the model saw them, each with its true
    class, the prediction and its probability. Data read as a stream (shards) cannot be revisited: none."""
    from .plots import plot_mistakes, to_display

    images, titles = [], []
    for j in worst_mistakes(probs, labels, MISTAKES):
        i = int(index[j])
        try:
            x = val_ds[i][0]
        except (TypeError, NotImplementedError):  # an IterableDataset
            return False
        if isinstance(x, dict):  # NaFlex patches: the picture at its own aspect ratio
            from ..data.naflex import unpatchify

            x = unpatchify(x, cfg.model.patch_size)
        p, y = probs[j].max(0), int(labels[j])
        name = Path(val_ds.describe(i)).name
        images.append(to_display(x, cfg.aug.mean, cfg.aug.std))
        titles.append(f"{name[:22]}\ntrue {classes[y]}\npredicted {classes[int(p.indices)]} "
                      f"{100 * float(p.values):.0f}%")
    plot_mistakes(images, titles, path)
    return True


def _multilabel(out: dict, cfg, val_ds, classes: list[str], threshold: float | None, checkpoint,
                out_dir: Path | None) -> Evaluation:
    """Per-class average precision, mAP, and precision / recall / F1 at the threshold (`threshold`, else
    training's, else the best on this data, which is reported beside it); with `out_dir`, the files."""
    logits, targets, index = out["logits"], out["labels"], out["index"]
    best = summarize_multilabel(logits, targets)  # threshold chosen on this data
    given = threshold if threshold is not None else saved_threshold(checkpoint)
    m = summarize_multilabel(logits, targets, given) if given is not None else best
    source = "--threshold" if threshold is not None else "training's validation split" if given else "this data"
    metrics = dict(n=m["n"], map=m["map"], loss=m["loss"], threshold=m["threshold"], threshold_from=source,
                   micro_f1=m["micro_f1"], micro_precision=m["micro_precision"], micro_recall=m["micro_recall"],
                   macro_f1=m["macro_f1"], best_threshold_here=best["threshold"], best_micro_f1_here=best["micro_f1"])
    per_class = [dict(**{"class": c}, ap=m["ap"][i], precision=m["precision"][i], recall=m["recall"][i],
                      f1=m["f1"][i], support=int(m["support"][i])) for i, c in enumerate(classes)]
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_csv(out_dir / "per_class.csv", ["class", "ap", "precision", "recall", "f1", "support"],
                         per_class)
        probs = logits.float().sigmoid()
        predicted, true = labels_above(probs, classes, m["threshold"]), labels_above(targets, classes, 0.5)
        rows = [{"sample": val_ds.describe(int(index[j])), "labels": true[j], "predicted": predicted[j],
                 **{f"prob_{c}": f"{float(probs[j, i]):.6f}" for i, c in enumerate(classes)}}
                for j in range(len(index))]
        atomic_write_csv(out_dir / "predictions.csv", list(rows[0]) if rows else ["sample"], rows)
    return Evaluation(metrics, per_class, None, val_ds)


def evaluate_checkpoint(checkpoint: str | Path, split: str = "val", data_dir: str | None = None,
                        overrides: dict | None = None, out_dir: Path | None = None, **options) -> dict:
    """metrics.json's dict for a train.py `checkpoint` folder scored on its config's `split` (or the class folders
    in `data_dir`), with --data.* / --aug.* `overrides`; `options`: evaluate_model's (batch_size, topk,
    threshold, ...). With `out_dir`, evaluate.py's files are written there too."""
    from .inference import load_model_and_config

    model, cfg, classes, _ = load_model_and_config(checkpoint=checkpoint, overrides=overrides)
    val_ds, classes, scored = eval_data(model, cfg, classes, split, data_dir)
    return evaluate_model(model, cfg, val_ds, classes, scored, checkpoint=checkpoint, out_dir=out_dir,
                          **options).metrics
