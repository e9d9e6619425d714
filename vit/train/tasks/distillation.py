"""Knowledge distillation (distill.teacher set): the student trains on the task loss of the run it would be without
a teacher (classification's, or multi-label's for feature kd: Mixup, smoothing and class weights as there) plus the
teacher's term, as timm 1.0.31's distillation tasks combine them (vit/train/distill.py):

    loss = task_weight * task(student(x~), y~) + distill_weight * kd(student, teacher, x~)

x~, y~ the batch as the task mixes it, so that the teacher sees the images the student sees. The teacher
(vit/train/teacher.py) is built once per process, frozen, moved to the accelerator's device and never prepared (it
does not train, so DistributedDataParallel has nothing to sync). Feature kd's projection is an extra module
(optimised, prepared and kept by Accelerate's training state), never in the saved student folder. Evaluation,
best/ and the saved checkpoint are the inner task's, of the student alone; a distilled (DeiT) student averages
its two heads there. A resumed run re-builds the teacher and refuses one whose weights hash differently.
"""

from __future__ import annotations

import torch

from .base import Evaluation, Task
from .classification import ClassificationTask
from .multilabel import MultiLabelTask

__all__ = ["DistillationTask"]


class DistillationTask(Task):
    """`inner`: the task the student would train on alone (its mixing, criterion, evaluation and checkpoints);
    `distiller`: vit.train.distill.Distiller between the student and its teacher."""

    def __init__(self, cfg, classes: list[str], inner: ClassificationTask, distiller) -> None:
        super().__init__(cfg, classes)
        self.inner, self.distiller, self.teacher = inner, distiller, distiller.teacher
        self.select_by = inner.select_by  # the inner task's metric ranks the checkpoints

    @classmethod
    def from_config(cls, cfg, classes, train_ds=None, model=None) -> DistillationTask:
        from ..distill import Distiller
        from ..teacher import build_teacher
        if model is None:
            raise ValueError("a distillation task needs the student model it trains (task_for(..., model=)).")
        # the run's own task without the teacher (registry.task_name's choice: feature kd joins multi-label runs)
        inner_class = MultiLabelTask if cfg.data.labels_file else ClassificationTask
        inner = inner_class.from_config(cfg, classes, train_ds, model)
        d = cfg.distill
        teacher = build_teacher(d.teacher, cfg.aug.mean, cfg.aug.std)
        if cfg.data.naflex is not None:  # before any step: the teacher must take the same patches
            teacher.require_naflex(cfg.model.patch_size)
        distiller = Distiller(model, teacher, inner.criterion, kind=d.kind, temperature=d.temperature,
                              task_weight=d.task_weight, distill_weight=d.distill_weight, token_mode=d.token_mode,
                              feature_loss=d.feature_loss, features=d.features)
        return cls(cfg, classes, inner, distiller)

    # --- training ---------------------------------------------------------------------------------------------

    def parts(self, run, x, y) -> dict[str, torch.Tensor]:
        """The Distiller's {'loss', 'output', 'task_loss', 'kd_loss'} of one micro-batch, mixed as the inner task
        mixes it; the teacher on the batch's device first."""
        device = (x["patches"] if isinstance(x, dict) else x).device  # a NaFlex batch is a dict
        if self.teacher.scale.device != device:  # once: the teacher follows the accelerator's device
            self.teacher.to(device)
        xm, ym = self.inner.mix(x, y)
        with run.accelerator.autocast():
            return self.distiller(run.model, xm, ym, run.extras.get("projection"))

    def loss(self, run, x, y) -> torch.Tensor:
        return self.parts(run, x, y)["loss"]

    def extra_modules(self) -> dict[str, torch.nn.Module]:
        """Feature kd's projection to the teacher's width (none when the widths match, nor for logit / token)."""
        p = self.distiller.projection
        return {"projection": p} if p is not None else {}

    def task_state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        return {"teacher": self.teacher.name, "teacher_sha256": self.teacher.digest}, {}

    def load_task_state(self, values: dict, tensors: dict[str, torch.Tensor]) -> None:
        """Refuse a resumed run whose teacher is not the saved run's (the weights' hash, vit/train/teacher.py)."""
        from ..runfolder import RunFolderError

        if values.get("teacher_sha256") != self.teacher.digest:
            raise RunFolderError(f"cannot resume: the teacher {self.teacher.name} has other weights (SHA-256 "
                                 f"{self.teacher.digest[:12]}...) than the saved run's "
                                 f"({str(values.get('teacher_sha256'))[:12]}...), and a resumed run must learn from "
                                 "the same teacher; restore its weights or start a new --run.name.")

    # --- evaluation and checkpoints: the student alone, as the inner task ------------------------------------

    def evaluate(self, run, model: torch.nn.Module) -> Evaluation:
        return self.inner.evaluate(run, model)

    def on_new_best(self, run, evaluation: Evaluation) -> None:
        self.inner.on_new_best(run, evaluation)

    def save(self, folder, model: torch.nn.Module, meta: dict, weights: dict | None = None) -> None:
        self.inner.save(folder, model, meta, weights)
