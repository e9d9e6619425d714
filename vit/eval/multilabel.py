"""Multi-label classification metrics: per-class average precision, mAP, and F1 at a decision threshold.

A multi-label model scores every class independently (a sigmoid per logit); a sample may have any number of
labels. Average precision (AP) of one class is the area under its precision-recall curve taken as a step
function over the distinct scores, AP = sum_n (R_n - R_{n-1}) P_n (as scikit-learn's average_precision_score,
the tests' oracle); mAP is its mean over the classes that have a positive. A single decision threshold for all
classes is chosen on the validation split as the one with the best micro-averaged F1 (ties: the lowest), and
then applied unchanged to new images (predict.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

__all__ = ["average_precision", "f1_at", "best_threshold", "summarize_multilabel", "saved_threshold",
           "decision_threshold", "labels_above"]


def average_precision(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-class AP (C,) from scores (N, C) and 0/1 targets (N, C); NaN for a class with no positive sample.
    Tied scores form one step of the curve, so the order of tied samples does not change the result."""
    scores, targets = scores.double(), (targets > 0.5).double()
    out = torch.full((scores.shape[1],), float("nan"), dtype=torch.float64)
    for c in range(scores.shape[1]):
        pos = targets[:, c].sum()
        if pos == 0:
            continue
        s, order = scores[:, c].sort(descending=True)
        tp = targets[order, c].cumsum(0)  # (N,) true positives among the top n+1
        last = torch.ones_like(s, dtype=torch.bool)
        last[:-1] = s[1:] != s[:-1]  # the last sample of each group of equal scores: one threshold each
        tp, n = tp[last], torch.arange(1, len(s) + 1, dtype=torch.float64)[last]
        recall, precision = tp / pos, tp / n
        out[c] = ((recall - torch.cat([recall.new_zeros(1), recall[:-1]])) * precision).sum()
    return out


def f1_at(probs: torch.Tensor, targets: torch.Tensor, threshold: float) -> dict[str, float | list]:
    """Precision, recall and F1 of predicting every class whose probability is >= `threshold`: micro-averaged
    (over all sample-class pairs), macro (mean over classes with a positive), and per class (lists)."""
    pred, true = probs >= threshold, targets > 0.5
    tp, fp, fn = (pred & true).sum(0).double(), (pred & ~true).sum(0).double(), (~pred & true).sum(0).double()

    def prf(tp, fp, fn):
        p = torch.where(tp + fp > 0, tp / (tp + fp).clamp(min=1), torch.zeros_like(tp))
        r = torch.where(tp + fn > 0, tp / (tp + fn).clamp(min=1), torch.zeros_like(tp))
        return p, r, torch.where(p + r > 0, 2 * p * r / (p + r).clamp(min=1e-12), torch.zeros_like(p))

    p, r, f = prf(tp, fp, fn)
    mp, mr, mf = prf(tp.sum(), fp.sum(), fn.sum())
    present = true.sum(0) > 0
    return dict(micro_precision=float(mp), micro_recall=float(mr), micro_f1=float(mf),
                macro_f1=float(f[present].mean()) if present.any() else 0.0,
                precision=p.tolist(), recall=r.tolist(), f1=f.tolist(), support=true.sum(0).tolist())


def best_threshold(probs: torch.Tensor, targets: torch.Tensor, grid: int = 99) -> float:
    """The threshold in {0.01, 0.02, ..., 0.99} with the best micro F1 on (probs, targets); ties: the lowest."""
    candidates = [round((i + 1) / (grid + 1), 4) for i in range(grid)]
    scores = [f1_at(probs, targets, t)["micro_f1"] for t in candidates]
    return candidates[max(range(grid), key=lambda i: (scores[i], -i))]


def summarize_multilabel(logits: torch.Tensor, targets: torch.Tensor, threshold: float | None = None) -> dict:
    """BCE loss, per-class AP, mAP and F1 at `threshold` (None: the best on this data, `best_threshold`)."""
    targets = targets.float()
    probs = logits.float().sigmoid()
    ap = average_precision(probs, targets)
    t = best_threshold(probs, targets) if threshold is None else threshold
    n = len(targets)
    loss = float(F.binary_cross_entropy_with_logits(logits.float(), targets, reduction="sum")) / max(1, n)
    present = ~ap.isnan()
    return dict(n=n, loss=loss / max(1, targets.shape[1]), ap=ap.tolist(),
                map=float(ap[present].mean()) if present.any() else 0.0, threshold=t, **f1_at(probs, targets, t))


def saved_threshold(checkpoint: str | Path | None) -> float | None:
    """The F1 threshold that training chose on its validation split (a checkpoint's meta.json), or None."""
    path = Path(checkpoint) / "meta.json" if checkpoint else None
    try:
        t = json.loads(path.read_text()).get("threshold") if path and path.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None
    return float(t) if type(t) in (int, float) and 0 < t < 1 else None


def decision_threshold(cfg, checkpoint: str | Path | None) -> float | None:
    """None for a single-label model; for a multi-label one (its config has data.labels_file) the threshold
    training chose on its validation split (`saved_threshold`), else 0.5."""
    if not cfg.data.labels_file:
        return None
    saved = saved_threshold(checkpoint)
    return saved if saved is not None else 0.5


def labels_above(probs: torch.Tensor, classes: list[str], threshold: float) -> list[str]:
    """Per sample, the names of the classes with probability >= threshold, separated by spaces."""
    return [" ".join(classes[j] for j in torch.nonzero(row >= threshold).flatten().tolist()) for row in probs]
