"""The contrastive run's step loss and evaluation (data.dataset: captions), called by vit/train/engine.py in place
of the classifier's: CLIP's or SigLIP's loss over each process's pairs with every process's captions as negatives
(vit.train.contrastive), and on the held-out pairs the mean loss per batch and image-to-caption retrieval top-1
(each image against the distinct held-out captions; with class-name captions, zero-shot accuracy)."""

from __future__ import annotations

import torch

from ..models.checkpoint import save_checkpoint
from .contrastive import clip_loss, siglip_loss
from .records import append_metrics, keep_best
from .tracking import log_row

__all__ = ["contrastive_step_loss", "evaluate_contrastive", "pair_loss", "retrieval_top1"]


def pair_loss(cfg, image: torch.Tensor, text: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
              local: bool = False) -> torch.Tensor:
    """contrastive.loss over normalised (n, E) features; local: these pairs only (no other process's)."""
    c = cfg.contrastive
    if c.loss == "siglip":
        return siglip_loss(image.float(), text.float(), scale.float(), bias.float(), c.exchange, local=local)
    return clip_loss(image.float(), text.float(), scale.float(), local=local)


def contrastive_step_loss(run, images: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The loss of one micro-batch: images (n, 3, S, S) and caption ids (n, L) of this process."""
    with run.accelerator.autocast():
        image, text, scale, *bias = run.model(images, ids)
    return pair_loss(run.cfg, image, text, scale, bias[0] if bias else None)


def retrieval_top1(image: torch.Tensor, text: torch.Tensor, ids: torch.Tensor) -> float:
    """Share of images whose most similar caption, among the distinct captions (rows of `ids` (N, L)), is their
    own. image, text: (N, E) normalised features of the pairs."""
    distinct, which = torch.unique(ids, dim=0, return_inverse=True)  # (U, L), (N,)
    first = torch.full((len(distinct),), len(ids)).scatter_reduce(0, which, torch.arange(len(ids)), "amin")
    return ((image @ text[first].T).argmax(1) == which).float().mean().item()


@torch.no_grad()
def evaluate_contrastive(run, stats, eval_model: torch.nn.Module, columns: dict) -> None:
    """Held-out loss and retrieval top-1, then last/ and best/ in open_clip's layout (vit/models/clip_save.py) and
    a metrics row; `columns`: the row's training columns."""
    acc, cfg, state = run.accelerator, run.cfg, run.state
    eval_model.eval()
    parts = []
    for images, ids in run.val_loader:
        with acc.autocast():
            image, text, scale, *bias = eval_model(images, ids)
        parts.append(acc.gather_for_metrics((image.float(), text.float(), ids)))
    eval_model.train()
    image, text, ids = (torch.cat([p[i] for p in parts]).cpu() for i in range(3))
    scale, bias = scale.float().cpu(), (bias[0].float().cpu() if bias else None)
    size = cfg.data.batch_size * acc.num_processes  # the loss of training-sized batches, as the train loss
    losses = [pair_loss(cfg, image[i:i + size], text[i:i + size], scale, bias, local=True)
              for i in range(0, len(ids), size)]
    loss, top1 = torch.stack(losses).mean().item(), retrieval_top1(image, text, ids)
    run.console.print(f"epoch {state.epoch:3d}  step {state.step:6d}  train loss {stats.train_loss:.4f}  "
                      f"val loss {loss:.4f}  val retrieval top-1 {100 * top1:.2f}%  ({len(ids)} pairs, "
                      f"{len(torch.unique(ids, dim=0))} captions)  {stats.images_per_s:.0f} img/s")
    weights = acc.get_state_dict(eval_model)
    if acc.is_main_process:
        meta = dict(epoch=state.epoch, step=state.step, val_acc1=top1, val_loss=loss, n=len(ids))
        unwrapped = acc.unwrap_model(eval_model)
        save_checkpoint(run.run_dir / "last", unwrapped, cfg, run.classes, meta, weights)
        keep_best(run, unwrapped, meta, weights)
        row = dict(columns, val_loss=loss, val_acc1=top1)
        append_metrics(run.run_dir / "metrics.csv", row)
        log_row(acc, row, cfg.run.log_every)
