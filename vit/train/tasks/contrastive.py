"""Contrastive image-text training (data.dataset: captions): CLIP's or SigLIP's loss over each process's pairs
with every process's captions as negatives (vit/train/contrastive.py), and on the held-out pairs the mean loss per
training-sized batch and image-to-caption retrieval top-1 (each image against the distinct held-out captions; with
class-name captions, zero-shot accuracy), recorded as val_acc1. Checkpoints are open_clip repositories
(vit/models/clip_save.py, through the base task's save)."""

from __future__ import annotations

import torch

from ..contrastive import clip_loss, siglip_loss
from .base import Evaluation, Task

__all__ = ["ContrastiveTask", "pair_loss", "retrieval_top1"]


def pair_loss(cfg, image: torch.Tensor, text: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
              local: bool = False) -> torch.Tensor:
    """contrastive.loss over normalised (n, E) features; local: these pairs only (no other process's)."""
    c = cfg.contrastive
    if c.loss == "siglip":
        return siglip_loss(image.float(), text.float(), scale.float(), bias.float(), c.exchange, local=local)
    return clip_loss(image.float(), text.float(), scale.float(), local=local)


def retrieval_top1(image: torch.Tensor, text: torch.Tensor, ids: torch.Tensor) -> float:
    """Share of images whose most similar caption, among the distinct captions (rows of `ids` (N, L)), is their
    own. image, text: (N, E) normalised features of the pairs."""
    distinct, which = torch.unique(ids, dim=0, return_inverse=True)  # (U, L), (N,)
    first = torch.full((len(distinct),), len(ids)).scatter_reduce(0, which, torch.arange(len(ids)), "amin")
    return ((image @ text[first].T).argmax(1) == which).float().mean().item()


class ContrastiveTask(Task):
    """A CLIP / SigLIP model on (images (n, 3, S, S), caption ids (n, L)) batches."""

    select_by = "top1"  # retrieval top-1, saved as val_acc1
    top1_name = "retrieval top-1"

    @classmethod
    def from_config(cls, cfg, classes, train_ds=None, model=None) -> ContrastiveTask:
        """The task; with the model, first the check its checkpoints will need: a model open_clip's repository
        layout cannot hold is refused now, in one sentence, not after the training it would lose."""
        if model is not None:
            from ...models.clip_save import open_clip_config, open_clip_state_dict_of

            open_clip_state_dict_of(model, open_clip_config(model))
        return cls(cfg, classes)

    def loss(self, run, images: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        with run.accelerator.autocast():
            image, text, scale, *bias = run.model(images, ids)
        return pair_loss(self.cfg, image, text, scale, bias[0] if bias else None)

    @torch.no_grad()
    def evaluate(self, run, model: torch.nn.Module) -> Evaluation:
        acc, cfg = run.accelerator, self.cfg
        model.eval()
        parts = []
        for images, ids in run.val_loader:
            with acc.autocast():
                image, text, scale, *bias = model(images, ids)
            parts.append(acc.gather_for_metrics((image.float(), text.float(), ids)))
        model.train()
        image, text, ids = (torch.cat([p[i] for p in parts]).cpu() for i in range(3))
        scale, bias = scale.float().cpu(), (bias[0].float().cpu() if bias else None)
        size = cfg.data.batch_size * acc.num_processes  # the loss of training-sized batches, as the train loss
        losses = [pair_loss(cfg, image[i:i + size], text[i:i + size], scale, bias, local=True)
                  for i in range(0, len(ids), size)]
        loss, top1 = torch.stack(losses).mean().item(), retrieval_top1(image, text, ids)
        line = (f"val loss {loss:.4f}  val retrieval top-1 {100 * top1:.2f}%  ({len(ids)} pairs, "
                f"{len(torch.unique(ids, dim=0))} captions)")
        return Evaluation(line, dict(val_loss=loss, val_acc1=top1), dict(val_acc1=top1, val_loss=loss, n=len(ids)))
