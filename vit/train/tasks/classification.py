"""Single-label classification (images or texts: data.dataset anything but captions, no data.labels_file):
cross-entropy on the logits, with label smoothing (aug.label_smoothing), class weights (optim.class_weights) and
timm's Mixup / CutMix (aug.mixup, aug.cutmix) on soft targets; evaluated by top-1 / top-5, macro F1 and balanced
accuracy, best/'s confusion matrix drawn beside it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import Evaluation, Task

__all__ = ["ClassificationTask", "make_mixup", "mix_batch"]


def make_mixup(cfg, num_classes: int, multi_label: bool = False):
    """timm's Mixup/CutMix (with label smoothing) when aug.mixup or aug.cutmix is set; None otherwise.
    `multi_label`: multi-hot targets, mixed as they are."""
    if cfg.aug.mixup <= 0 and cfg.aug.cutmix <= 0:
        return None
    from timm.data import Mixup

    return Mixup(mixup_alpha=cfg.aug.mixup, cutmix_alpha=cfg.aug.cutmix, prob=cfg.aug.mixup_prob,
                 label_smoothing=cfg.aug.label_smoothing, num_classes=num_classes, multi_label=multi_label)


def mix_batch(mixup_fn, x: torch.Tensor, y: torch.Tensor, num_classes: int, smoothing: float,
              multi_label: bool = False):
    """timm's Mixup needs an even batch; an odd last sample keeps its own (smoothed) one-hot target.
    `multi_label`: `y` is multi-hot (B, C), mixed as it is (timm's Mixup(multi_label=True))."""
    from timm.data.mixup import mixup_target

    if mixup_fn is None:
        return x, y
    if x.shape[0] % 2 == 0:
        return mixup_fn(x, y)
    xm, ym = mixup_fn(x[:-1], y[:-1])
    y_last = mixup_target(y[-1:], num_classes, lam=1.0, smoothing=smoothing, multi_label=multi_label)
    return torch.cat([xm, x[-1:]]), torch.cat([ym, y_last.to(ym)])


class ClassificationTask(Task):
    """Softmax over the classes. `mixup`: timm's Mixup or None; `class_weights`: (num_classes,) or None."""

    select_by = "top1"
    multi_label = False

    def __init__(self, cfg, classes: list[str], mixup=None, class_weights: torch.Tensor | None = None) -> None:
        super().__init__(cfg, classes)
        self.mixup, self.class_weights = mixup, class_weights

    @classmethod
    def from_config(cls, cfg, classes, train_ds=None, model=None) -> ClassificationTask:
        from ...data import class_weights

        weights = class_weights(cfg, train_ds) if train_ds is not None else None
        return cls(cfg, classes, make_mixup(cfg, len(classes), cls.multi_label), weights)

    def mix(self, x, y) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch the model trains on: mixed, with soft targets (B, C), when Mixup is on; else as given."""
        return mix_batch(self.mixup, x, y, len(self.classes), self.cfg.aug.label_smoothing, self.multi_label)

    def logits(self, run, x, y) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits (B, C), targets) of the batch as `mix` gives it."""
        xm, ym = self.mix(x, y)
        with run.accelerator.autocast():
            return run.model(xm), ym

    def criterion(self, logits: torch.Tensor, ym: torch.Tensor) -> torch.Tensor:
        """The loss of logits (B, C) against the targets `mix` gave: class indices (B,) or soft targets (B, C)."""
        w = self.class_weights.to(logits.device) if self.class_weights is not None else None
        if self.mixup is not None:  # soft targets (B, num_classes); weighted and normalised by the targets' weights,
            # as cross_entropy(weight=) does for class indices, so mixing does not change what a weight means
            per_class = -ym * F.log_softmax(logits.float(), dim=-1)  # (B, C)
            if w is None:
                return per_class.sum(-1).mean()
            return (per_class * w).sum() / (ym * w).sum()
        return F.cross_entropy(logits.float(), ym, weight=w, label_smoothing=self.cfg.aug.label_smoothing)

    def loss(self, run, x, y) -> torch.Tensor:
        return self.criterion(*self.logits(run, x, y))

    def evaluate(self, run, model: torch.nn.Module) -> Evaluation:
        from ...eval.metrics import predict, summarize_logits

        out = predict(model, run.val_loader, run.accelerator)
        m = summarize_logits(out["logits"], out["labels"])
        skipped = f"; skipped {out['skipped']} unreadable" if out.get("skipped") else ""
        shards = getattr(run.val_loader, "dataset", None)
        if hasattr(shards, "check_seen"):  # shards given with a count (after '|') that may be wrong
            shards.check_seen(m["n"] + out.get("skipped", 0))
        line = f"val loss {m['loss']:.4f}  val top-1 {100 * m['acc1']:.2f}%  ({m['n']} images{skipped})"
        balanced = dict(val_macro_f1=m["macro_f1"], val_balanced_accuracy=m["balanced_accuracy"])
        row = dict(val_loss=m["loss"], val_acc1=m["acc1"], val_acc5=m.get("acc5", ""), **balanced)
        meta = dict(val_acc1=m["acc1"], val_loss=m["loss"], n=m["n"], **balanced)
        return Evaluation(line, row, meta, outputs=out)

    def on_new_best(self, run, evaluation: Evaluation) -> None:
        """best/'s confusion matrix, for a look and for MLflow."""
        from ...eval.metrics import per_class_metrics
        from ...eval.plots import plot_confusion

        out = evaluation.outputs
        conf, _, _ = per_class_metrics(out["labels"].numpy(), out["logits"].argmax(1).numpy(), len(self.classes))
        plot_confusion(conf, self.classes, run.run_dir / "confusion.png")
