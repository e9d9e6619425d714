"""DeepSeek's two stages of indexer training by optimizer step, for a training loop: the stage each step runs in
(`indexer_schedule`: "warmup", then "sparse") and the warm-up's gradient rule (`indexer_only_grads`). The stages
themselves, and the indexer's KL, are the layer's (vit/layers/sparse_attention.py)."""

from __future__ import annotations

from torch import nn

from ..layers.sparse_attention import set_indexer_stage, sparse_modules

__all__ = ["indexer_schedule", "indexer_only_grads"]


def indexer_schedule(model: nn.Module, step: int, warmup_steps: int, kl_rows: str | None = None) -> str | None:
    """DeepSeek's two stages by optimizer step, for a training loop: "warmup" for the first `warmup_steps`, then
    "sparse"; None for a model with no DSA layer (nothing changes). Returns the stage, which says what to
    minimise: in the warm-up only the indexers learn, so the loop minimises `indexer_loss` (plus 0 x the task loss,
    so that DDP sees every parameter used) and calls `indexer_only_grads` before its optimizer step. No
    `requires_grad` is toggled: DDP fixes the parameters it reduces when it wraps the model. `kl_rows`: see
    `set_indexer_stage`."""
    layers = [m for m in sparse_modules(model) if m.indexer is not None]
    if not layers:
        return None
    stage = "warmup" if step < warmup_steps else "sparse"
    if layers[0].stage != stage or (kl_rows is not None and layers[0].kl_rows != kl_rows):
        set_indexer_stage(model, stage, kl_rows)
    return stage


def indexer_only_grads(model: nn.Module) -> None:
    """Drop the gradient of every parameter outside the DSA indexers (set to None, so that the optimizer skips
    them: no update, no weight decay, no moment change): the warm-up's optimizer step moves the indexers only."""
    indexer = {id(p) for m in sparse_modules(model) if m.indexer is not None for p in m.indexer.parameters()}
    for p in model.parameters():
        if id(p) not in indexer:
            p.grad = None
