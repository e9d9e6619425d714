"""Multi-label classification (data.labels_file: images with any number of labels): a sigmoid per class, binary
cross-entropy on multi-hot targets (smoothed towards 0.5 as timm does; Mixup mixes them as they are), evaluated by
mAP and the micro F1 at the threshold chosen on the held-out split, which meta.json keeps for predict.py and
evaluate.py; mAP ranks the checkpoints unless run.select_by says otherwise."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import Evaluation
from .classification import ClassificationTask

__all__ = ["MultiLabelTask"]


class MultiLabelTask(ClassificationTask):
    """ClassificationTask's batch and model, BCE and mAP in place of softmax and top-1; no class weights."""

    select_by = "map"
    multi_label = True

    def criterion(self, logits: torch.Tensor, ym: torch.Tensor) -> torch.Tensor:
        smoothing = self.cfg.aug.label_smoothing
        target = ym if self.mixup is not None else ym.float() * (1 - smoothing) + 0.5 * smoothing  # (B, C)
        return F.binary_cross_entropy_with_logits(logits.float(), target)

    def evaluate(self, run, model: torch.nn.Module) -> Evaluation:
        from ...eval.metrics import predict
        from ...eval.multilabel import summarize_multilabel

        out = predict(model, run.val_loader, run.accelerator)
        m = summarize_multilabel(out["logits"], out["labels"])
        line = (f"val loss {m['loss']:.4f}  val mAP {100 * m['map']:.2f}%  F1 {m['micro_f1']:.3f} at "
                f"{m['threshold']:.2f}  ({m['n']} images)")
        meta = dict(val_map=m["map"], val_loss=m["loss"], n=m["n"], threshold=m["threshold"],
                    val_micro_f1=m["micro_f1"])
        return Evaluation(line, dict(val_loss=m["loss"], val_map=m["map"]), meta)

    def on_new_best(self, run, evaluation: Evaluation) -> None:
        """No confusion matrix: a multi-label run has no single predicted class."""
