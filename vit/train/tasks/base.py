"""The training task seam: what one training mode owns, so that the loop (vit/train/engine.py) never asks which
data it has. Modelled on timm's `timm.task.TrainingTask` (timm 1.0.31), adapted to a loop that Accelerate drives.

A task owns
- `loss(run, x, y)`: one micro-batch's loss to minimise (mixing, smoothing, weights, the criterion), a scalar;
- `evaluate(run, model)`: the held-out metrics as an `Evaluation` (console text, metrics.csv's val_* columns,
  meta.json's values), and `on_new_best` for what a new best checkpoint draws beside it;
- `select_by`: the run.select_by used when the config leaves it unset (`records.SELECT_BY` names its meta key
  and direction);
- `save(folder, model, meta, weights)`: one checkpoint folder of the eval model.

Hooks a mode beyond classification needs (issues 48-50: distillation, DINO / MAE pretraining, segmentation), each
a no-op here and called by the loop for every task:
- `extra_modules()`: trainable modules besides the model (a distillation projection, a DINO head). train.py gives
  their parameters to the optimizer and each module to `accelerator.prepare` (so DDP syncs its gradients: call it
  through its own forward), the loop clips and accumulates them with the model, and Accelerate's training state
  holds them, so a resume restores them exactly; `run.extras` holds the prepared ones by name. They are not in the
  checkpoint folder unless `save` writes them (an export ships the model alone).
- `task_state()` / `load_task_state(values, tensors)`: what an exact resume needs beyond model, extra modules,
  optimizer, RNG and the loop's counters (a DINO centre, a teacher's weight hash): JSON values and tensors, saved
  as task_state.json and task_state.safetensors in the state folder (never pickle; nothing saved when empty).
- `bypasses_wrapper`: True for a task that runs the model's parts itself (`accelerator.unwrap_model(run.model)`:
  DINO's masked crops, MAE's visible patches) instead of calling the prepared wrapper. DistributedDataParallel
  only averages the gradients of a backward that followed its own forward, so for such a task the loop averages
  every trained gradient across processes itself before each optimizer step (`engine.average_gradients`).
- `after_step(run)`: after every optimizer step on every process, once `run.state.step` has advanced and the EMA
  moved (an EMA teacher's momentum update); like the EMA, also after a step skipped as non-finite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch

__all__ = ["Task", "Evaluation"]


@dataclass
class Evaluation:
    """One evaluation's results, as the loop prints, records and saves them."""
    line: str  # the console's words between the train loss and the speed ("val loss 0.12  val top-1 99.4% ...")
    row: dict  # metrics.csv's val_* columns (names in records.METRIC_FIELDS)
    meta: dict  # meta.json's values after epoch and step; holds the select_by key (records.SELECT_BY)
    outputs: dict = field(default_factory=dict)  # what the task's own on_new_best reads (e.g. logits, labels)


class Task:
    """One training mode. Subclasses set `select_by` and implement `loss` and `evaluate`; the rest has
    defaults that every mode here uses. `cfg`, `classes`: the resolved config and the class names."""

    select_by: ClassVar[str] = "top1"  # run.select_by when the config leaves it unset
    bypasses_wrapper: ClassVar[bool] = False  # the loop averages gradients across processes itself (above)
    top1_name: ClassVar[str] = "top-1"  # what this task records as val_acc1, in the run's last line

    def __init__(self, cfg, classes: list[str]) -> None:
        self.cfg, self.classes = cfg, classes

    @classmethod
    def from_config(cls, cfg, classes: list[str], train_ds=None, model: torch.nn.Module | None = None) -> Task:
        """The task a config describes; `train_ds` (class counts for weights) and `model` (the model to train, whose
        width a projection would read) are there for the tasks that need them."""
        return cls(cfg, classes)

    # --- training ---------------------------------------------------------------------------------------------

    def loss(self, run, x, y) -> torch.Tensor:
        """The loss of one micro-batch (x, y as the train loader yields them), a scalar to minimise."""
        raise NotImplementedError

    def extra_modules(self) -> dict[str, torch.nn.Module]:
        """Trainable modules besides the model, by name (module docstring); none by default."""
        return {}

    def after_step(self, run) -> None:
        """Called after every optimizer step (module docstring); nothing by default."""

    def task_state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """(JSON-able values, tensors) an exact resume needs beyond what the loop saves; ({}, {}) by default."""
        return {}, {}

    def load_task_state(self, values: dict, tensors: dict[str, torch.Tensor]) -> None:
        """Restore what `task_state` returned (read back from JSON and safetensors)."""

    # --- evaluation and checkpoints ---------------------------------------------------------------------------

    def evaluate(self, run, model: torch.nn.Module) -> Evaluation:
        """The held-out metrics of `model` (the EMA weights when optim.ema), on every process."""
        raise NotImplementedError

    def on_new_best(self, run, evaluation: Evaluation) -> None:
        """On the main process, when this evaluation's checkpoint became best/; nothing by default."""

    def save(self, folder: Path, model: torch.nn.Module, meta: dict, weights: dict | None = None) -> None:
        """One checkpoint folder of `model` (unwrapped; `weights`: its gathered state dict): LoRA adapters merged
        into plain weights, a CLIP model in open_clip's layout (vit/models/checkpoint.py)."""
        from ...models.checkpoint import save_checkpoint
        from ..lora import has_lora, merged_state_dict

        if has_lora(model):
            weights = merged_state_dict(model, weights)  # no adapter saved
        save_checkpoint(folder, model, self.cfg, self.classes, meta, weights)
