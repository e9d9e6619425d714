"""Which task a config trains, decided here and nowhere else: `task_name` reads the config, `TASKS` maps the name
to its class. A new training mode is a module in this package, a row in `TASKS` and, if the config selects it,
a line in `task_name` (docs/contributing.md: the task seam)."""

from __future__ import annotations

from .base import Task
from .classification import ClassificationTask
from .contrastive import ContrastiveTask
from .distillation import DistillationTask
from .mae import MAETask
from .multilabel import MultiLabelTask
from .pretrain import DinoTask
from .segmentation import SegmentationTask

__all__ = ["TASKS", "task_name", "task_class", "task_for"]

# Text classification (data.dataset: text_csv) is classification: the same loss, metrics and checkpoints, on
# token ids (vit/models/text_build.py builds its model, vit/models/checkpoint.py saves it in transformers' layout).
TASKS: dict[str, type[Task]] = {
    "classification": ClassificationTask,  # one label per image or text
    "multilabel": MultiLabelTask,  # data.labels_file: any number of labels per image
    "contrastive": ContrastiveTask,  # data.dataset: captions, image-caption pairs
    "distillation": DistillationTask,  # distill.teacher: the student on its task's loss plus the teacher's term
    "dino": DinoTask,  # pretrain.method: dino, self-supervised on unlabelled images
    "mae": MAETask,  # pretrain.method: mae, masked autoencoding of unlabelled images
    "segmentation": SegmentationTask,  # data.dataset: segmentation, a class per pixel
}


def task_name(cfg) -> str:
    """The training mode `cfg` asks for (a key of TASKS)."""
    if cfg.pretrain.method is not None:  # no labels: the pretraining method is the task
        return cfg.pretrain.method
    if cfg.data.dataset == "captions":
        return "contrastive"
    if cfg.data.dataset == "segmentation":
        return "segmentation"
    if cfg.distill.teacher is not None:  # on top of the run's own task (DistillationTask.inner)
        return "distillation"
    if cfg.data.labels_file:
        return "multilabel"
    return "classification"


def task_class(name: str) -> type[Task]:
    """TASKS[name], or one sentence naming the known ones."""
    if name not in TASKS:
        raise ValueError(f"unknown training task {name!r}; the tasks are {', '.join(map(repr, TASKS))}.")
    return TASKS[name]


def task_for(cfg, classes: list[str], train_ds=None, model=None) -> Task:
    """The task that trains `cfg` (Task.from_config: `train_ds` for class weights, `model` for a mode that sizes
    modules of its own from it)."""
    return task_class(task_name(cfg)).from_config(cfg, classes, train_ds, model)
