"""Classification metrics computed the same way on one process or many.

`predict` runs a model over a loader and gathers logits and labels with `accelerator.gather_for_metrics`,
which drops the samples that distributed samplers duplicate to even out the last batch: every sample is
counted exactly once. `summarize_logits` turns them into loss, top-1/top-5, macro F1, balanced accuracy and
calibration numbers; `per_class_metrics` into the confusion matrix and per-class precision/recall/F1, computed
by scikit-learn.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["predict", "end_processes", "topk_correct", "summarize_logits", "expected_calibration_error",
           "per_class_metrics", "class_balanced_scores", "worst_mistakes"]


def end_processes(accelerator) -> bool:
    """After the last collective: close the process group on every rank, so that a rank leaving early does not tear
    gloo's threads down under the others (std::terminate, SIGABRT, the run killed). True on the main process."""
    is_main = accelerator.is_main_process
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return is_main


@torch.no_grad()
def predict(model, loader, accelerator) -> dict[str, torch.Tensor]:
    """Logits (N, C) and labels (N,) of the whole split, gathered on every process (float32, on CPU).
    Batches may carry a third element, the sample indices; they are gathered too and the result is put in
    index order (`index`), with `skipped`: how many unreadable images a shard reader dropped (index -2)."""
    model.eval()
    out: dict[str, list] = {"logits": [], "labels": [], "index": []}
    for batch in loader:
        x, rest = batch[0], tuple(batch[1:])
        with accelerator.autocast():
            logits = model(x)
        gathered = accelerator.gather_for_metrics((logits.float().contiguous(), *rest))
        for key, value in zip(("logits", "labels", "index"), gathered):
            out[key].append(value.cpu())
    res = {k: torch.cat(v) for k, v in out.items() if v}
    if "index" in res:
        # index -1: padding that evens out the processes' batches; -2: an unreadable image (vit/data/shard_loader.py)
        res["skipped"] = int((res["index"] == -2).sum())
        keep = res["index"] >= 0
        res = {k: v[keep] if torch.is_tensor(v) else v for k, v in res.items()}
        order = res["index"].argsort()
        res = {k: v[order] if torch.is_tensor(v) else v for k, v in res.items()}
    return res


def topk_correct(logits: torch.Tensor, labels: torch.Tensor, k: int) -> int:
    k = min(k, logits.shape[1])
    return int((logits.topk(k, dim=1).indices == labels[:, None]).any(dim=1).sum())


def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15) -> tuple[float, list]:
    """ECE (Guo et al., 2017): confidence-binned |accuracy - confidence|, weighted by bin size. Also returns
    the bins (lower, upper, count, accuracy, confidence) for a reliability diagram."""
    conf, pred = probs.max(dim=1)
    correct = (pred == labels).float()
    edges = torch.linspace(0, 1, n_bins + 1)
    ece, bins = 0.0, []
    for lo, hi in zip(edges[:-1], edges[1:]):
        inb = (conf > lo) & (conf <= hi) if lo > 0 else (conf >= lo) & (conf <= hi)
        n = int(inb.sum())
        acc = float(correct[inb].mean()) if n else 0.0
        c = float(conf[inb].mean()) if n else 0.0
        ece += n / max(1, len(labels)) * abs(acc - c)
        bins.append((float(lo), float(hi), n, acc, c))
    return ece, bins


def per_class_metrics(labels: np.ndarray, preds: np.ndarray, num_classes: int
                      ) -> tuple[np.ndarray, list[dict], dict[str, dict[str, float]]]:
    """The confusion matrix (num_classes, num_classes) (rows: true class, columns: predicted), one row of
    precision/recall/F1/support per class, and their averages: macro over the classes present in `labels` (a
    class absent from the split has no recall to average) and weighted by support. A class never predicted
    has precision 0 (scikit-learn's zero_division=0)."""
    from sklearn.metrics import confusion_matrix, precision_recall_fscore_support

    every = np.arange(num_classes)
    conf = confusion_matrix(labels, preds, labels=every)
    p, r, f, s = precision_recall_fscore_support(labels, preds, labels=every, zero_division=0)
    rows = [dict(precision=float(a), recall=float(b), f1=float(c), support=int(d)) for a, b, c, d in zip(p, r, f, s)]
    present = every[s > 0]
    avgs = {}
    for name, which in (("macro", present), ("weighted", every)):
        a, b, c, _ = precision_recall_fscore_support(labels, preds, labels=which, average=name, zero_division=0)
        avgs[name] = dict(precision=float(a), recall=float(b), f1=float(c))
    return conf, rows, avgs


def class_balanced_scores(preds: torch.Tensor, labels: torch.Tensor, num_classes: int) -> dict[str, float]:
    """Macro F1 and balanced accuracy (the mean of per-class recall), each averaged over the classes present in
    `labels` as `per_class_metrics` averages them (scikit-learn's f1_score(labels=present, average='macro',
    zero_division=0) and balanced_accuracy_score). Unlike top-1, a class with few images weighs as much as any.
    preds, labels (N,) class indices; 0.0 for an empty split."""
    c = num_classes
    conf = torch.bincount(labels.long() * c + preds.long(), minlength=c * c).reshape(c, c).double()  # (true, pred)
    tp, support, predicted = conf.diag(), conf.sum(1), conf.sum(0)
    present = support > 0
    if not present.any():
        return dict(macro_f1=0.0, balanced_accuracy=0.0)
    recall = tp / support.clamp(min=1)
    f1 = 2 * tp / (support + predicted).clamp(min=1)  # 2PR / (P + R); 0 where the class is never right
    return dict(macro_f1=float(f1[present].mean()), balanced_accuracy=float(recall[present].mean()))


def summarize_logits(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    n = len(labels)
    out = {
        "n": n,
        "loss": float(F.cross_entropy(logits, labels, reduction="sum")) / max(1, n),
        "acc1": topk_correct(logits, labels, 1) / max(1, n),
    }
    if logits.shape[1] > 5:
        out["acc5"] = topk_correct(logits, labels, 5) / max(1, n)
    out.update(class_balanced_scores(logits.argmax(1), labels, logits.shape[1]))
    out["ece"] = expected_calibration_error(logits.softmax(dim=1), labels)[0]
    return out


def worst_mistakes(probs: torch.Tensor, labels: torch.Tensor, n: int = 16) -> list[int]:
    """Rows of the misclassified samples, the most confident (highest top-1 probability) first, at most n;
    ties keep the dataset's order. probs (N, K), labels (N,)."""
    conf, pred = probs.max(1)
    wrong = (pred != labels).nonzero().flatten()
    order = sorted(wrong.tolist(), key=lambda j: (-float(conf[j]), j))
    return order[:n]
