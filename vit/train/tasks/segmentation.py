"""Semantic segmentation (a Segmenter on (images (B, 3, S, S), masks (B, S, S)) batches, or NaFlex batches with a
list of masks, each image's pixels counted once: vit.eval.segmentation.flat_pixels): per-pixel cross-entropy
with class weights, soft Dice, or their sum, pixels of the ignore index (255) left out of both; evaluated by mIoU,
per-class IoU, mean Dice and pixel accuracy over the held-out pixels (vit/eval/segmentation.py), best/ chosen by
mIoU (saved as val_acc1, so run.select_by "top1" ranks by it).

Soft Dice (Milletari et al., 2016, V-Net), per class c over the batch's counted pixels, probabilities p, one-hot t:
    dice_c = (2 sum p_c t_c + eps) / (sum p_c + sum t_c + eps),   loss = 1 - mean_c dice_c
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import Evaluation, Task

__all__ = ["SEG_LOSSES", "dice_loss", "seg_loss", "SegmentationTask"]

SEG_LOSSES = ("ce", "dice", "ce+dice")
IGNORE_INDEX = 255


def dice_loss(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = IGNORE_INDEX,
              eps: float = 1.0) -> torch.Tensor:
    """1 - mean soft Dice over classes (module docstring); logits (B, C, H, W), target (B, H, W)."""
    c = logits.shape[1]
    keep = (target != ignore_index).unsqueeze(1)  # (B, 1, H, W)
    p = logits.float().softmax(1) * keep
    t = F.one_hot(torch.where(keep[:, 0], target, 0).long(), c).permute(0, 3, 1, 2) * keep  # (B, C, H, W)
    inter, total = (p * t).sum((0, 2, 3)), p.sum((0, 2, 3)) + t.sum((0, 2, 3))
    return 1 - ((2 * inter + eps) / (total + eps)).mean()


def seg_loss(logits: torch.Tensor, target: torch.Tensor, loss: str = "ce", class_weights: torch.Tensor | None = None,
             ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """The loss `loss` (SEG_LOSSES) of logits (B, C, H, W) against class indices (B, H, W)."""
    if loss not in SEG_LOSSES:
        raise ValueError(f"unknown segmentation loss {loss!r}; choose from {', '.join(SEG_LOSSES)}.")
    total = logits.new_zeros((), dtype=torch.float32)
    if "ce" in loss.split("+"):
        w = class_weights.to(logits.device) if class_weights is not None else None
        total = total + F.cross_entropy(logits.float(), target.long(), weight=w, ignore_index=ignore_index)
    if "dice" in loss.split("+"):
        total = total + dice_loss(logits, target, ignore_index)
    return total


class SegmentationTask(Task):
    """Per-pixel classes. `loss`: one of SEG_LOSSES; `class_weights`: (C,) for the cross-entropy or None."""

    select_by = "top1"  # mIoU, recorded as val_acc1
    top1_name = "mIoU"

    def __init__(self, cfg, classes: list[str], loss: str = "ce", class_weights: torch.Tensor | None = None) -> None:
        super().__init__(cfg, classes)
        self.loss_name, self.class_weights = loss, class_weights

    @classmethod
    def from_config(cls, cfg, classes, train_ds=None, model=None) -> SegmentationTask:
        from ...data.segmentation import pixel_class_weights

        weights = None
        if cfg.optim.class_weights == "auto" and train_ds is not None:  # inverse pixel frequency of each class
            weights = pixel_class_weights(train_ds)
        return cls(cfg, classes, cfg.seg.loss, weights)

    def loss(self, run, x, y) -> torch.Tensor:
        from ...eval.segmentation import flat_pixels

        with run.accelerator.autocast():
            logits, y = flat_pixels(run.model(x), y)  # NaFlex: per-image logits and masks, every pixel once
        return seg_loss(logits, y, self.loss_name, self.class_weights)

    def _val_logits(self, model: torch.nn.Module, x, y) -> tuple:
        """A val batch's (logits, masks): a tensor or NaFlex batch through the model; images at their files' sizes
        (a list) each as predict.py reads it (resized, or in sliding windows), stacked into one batch when all are
        the input size."""
        if not isinstance(x, list):
            return model(x), y
        from ...eval.segmentation import image_logits

        size = self.cfg.model.img_size
        if all(tuple(xi.shape[-2:]) == (size, size) for xi in x):
            return model(torch.stack(x)), torch.stack(y)
        return [image_logits(model, xi[None], size, self.cfg.seg.window)[0] for xi in x], y

    @torch.no_grad()
    def evaluate(self, run, model: torch.nn.Module) -> Evaluation:
        from ...eval.segmentation import confusion, flat_pixels, seg_scores

        acc, n = run.accelerator, len(self.classes)
        model.eval()
        conf, losses = torch.zeros(n, n, dtype=torch.int64, device=acc.device), []
        for x, y in run.val_loader:
            with acc.autocast():
                logits, y = flat_pixels(*self._val_logits(model, x, y))
            losses.append(seg_loss(logits, y, self.loss_name, self.class_weights).detach())
            conf += confusion(logits.argmax(1), y, n).to(acc.device)
        model.train()
        conf = acc.reduce(conf, "sum").cpu() if acc.num_processes > 1 else conf.cpu()
        s = seg_scores(conf)
        loss = torch.stack(losses).mean().item() if losses else float("nan")
        per_class = "  ".join(f"{c} {100 * v:.1f}" for c, v in zip(self.classes, s["iou"]))
        line = (f"val loss {loss:.4f}  val mIoU {100 * s['miou']:.2f}%  pixel acc {100 * s['pixel_acc']:.2f}%  "
                f"IoU: {per_class}")
        if not s["pixels"]:  # every held-out pixel is the ignore index: nothing to score, said rather than a bare nan
            line += f"  (no val pixel is scored: every mask pixel is {IGNORE_INDEX}, the ignore index)"
        meta = dict(val_acc1=s["miou"], val_loss=loss, n=s["pixels"], miou=s["miou"], iou=s["iou"], dice=s["dice"],
                    pixel_acc=s["pixel_acc"])
        return Evaluation(line, dict(val_loss=loss, val_acc1=s["miou"]), meta, outputs={"confusion": conf})
