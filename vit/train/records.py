"""What a run keeps of its evaluations: metrics.csv (one row per evaluation, rewritten atomically, trimmed back on a
resume) and the best checkpoints by run.select_by (best/, and top/epoch-XXXX for the runners-up)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import torch

from ..utils.atomic import atomic_write_csv

__all__ = ["METRIC_FIELDS", "append_metrics", "trim_metrics", "SELECT_BY", "select_by", "rank_best", "keep_best",
           "describe_best"]

METRIC_FIELDS = ["step", "epoch", "lr", "train_loss", "val_loss", "val_acc1", "val_acc5", "images_per_s",
                 "skipped_steps", "val_map", "indexer_loss",  # val_map: multi-label runs, which have no top-1
                 "val_macro_f1", "val_balanced_accuracy",
                 "val_spread",  # val_spread: self-supervised runs (vit/train/ssl_losses.py:feature_spread), no labels
                 "val_knn"]  # their k-NN top-1 on pretrain.knn_root's few labelled images (vit/train/knn_monitor.py)

# run.select_by -> (the checkpoint meta's key, its name in a sentence, higher is better)
SELECT_BY = {"top1": ("val_acc1", "top-1", True), "macro_f1": ("val_macro_f1", "macro F1", True),
             "balanced_accuracy": ("val_balanced_accuracy", "balanced accuracy", True),
             "loss": ("val_loss", "loss", False), "map": ("val_map", "mAP", True),
             "spread": ("val_spread", "feature spread", True)}


def select_by(cfg, task=None) -> str:
    """The run.select_by that ranks checkpoints: as set, else the task's (Task.select_by: top1, map for multi-label
    data; `task` None: the config's task)."""
    from .tasks.registry import task_class, task_name

    return cfg.run.select_by or (task if task is not None else task_class(task_name(cfg))).select_by


def rank_best(best: list, score: float, epoch: int, higher_is_better: bool = True) -> list:
    """[[score, epoch]] of the kept checkpoints and this epoch's, best first; a tie goes to the earlier epoch
    (a later epoch must do better to replace best/)."""
    sign = -1 if higher_is_better else 1
    return sorted([*best, [score, epoch]], key=lambda t: (sign * t[0], t[1]))


def describe_best(cfg, best: list, task=None) -> str:
    """'best val macro F1 81.25% at epoch 7' for the first of `best` ([[score, epoch]]), ranked by `task`'s
    select_by (None: the config's task)."""
    from .tasks.registry import task_class, task_name

    score, epoch = best[0]
    chosen = select_by(cfg, task)
    _, name, higher = SELECT_BY[chosen]
    if chosen == "top1":  # what the task records as val_acc1 (a segmenter's mIoU, CLIP's retrieval top-1)
        name = (task if task is not None else task_class(task_name(cfg))).top1_name
    return f"best val {name} {100 * score:.2f}% at epoch {epoch}" if higher else \
        f"best val {name} {score:.4f} at epoch {epoch}"


def keep_best(run, model: torch.nn.Module, meta: dict, weights: dict | None = None, task=None) -> bool:
    """`best/` holds the best checkpoint by run.select_by (the task's default unless set: top-1, mAP for
    multi-label); with run.keep_best > 1 the runners-up live in top/epoch-XXXX. `run` is vit.train.engine.Run (not
    imported: the engine imports this module); `task` writes the folders (Task.save; None: the config's task).
    True when this checkpoint became best/."""
    from .tasks.registry import task_for

    task = task if task is not None else task_for(run.cfg, run.classes)
    k, state, run_dir = run.cfg.run.keep_best, run.state, run.run_dir
    key, _, higher = SELECT_BY[select_by(run.cfg, task)]
    score, epoch = meta[key], meta["epoch"]
    ranked = rank_best(state.best, score, epoch, higher)
    if [score, epoch] not in ranked[:k]:
        return False
    if ranked[0] == [score, epoch]:
        task.save(run_dir / "best", model, meta, weights)
    if k > 1:
        task.save(run_dir / "top" / f"epoch-{epoch:04d}", model, meta, weights)
        for _, e in ranked[k:]:
            shutil.rmtree(run_dir / "top" / f"epoch-{e:04d}", ignore_errors=True)
    state.best = ranked[:k]
    return ranked[0] == [score, epoch]


def _read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def append_metrics(path: Path, row: dict) -> None:
    """Add one row to the run's metrics.csv (rewritten atomically: a kill never leaves half a row)."""
    rows = _read_metrics(path) + [{k: row.get(k, "") for k in METRIC_FIELDS}]
    atomic_write_csv(path, METRIC_FIELDS, rows)


def trim_metrics(path: Path, step: int) -> None:
    """On resume, forget rows written after the state we resumed from (they will be written again)."""
    rows = _read_metrics(path)
    kept = [r for r in rows if int(r["step"]) <= step]
    if len(kept) != len(rows) or (not kept and path.is_file()):
        atomic_write_csv(path, METRIC_FIELDS, kept)
