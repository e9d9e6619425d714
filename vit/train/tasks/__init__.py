"""Training tasks, one per mode, each owning its loss, evaluation, checkpoint choice and what it saves: `base`
(Task, Evaluation: the seam and its hooks), `classification` (softmax, Mixup, class weights; images and texts),
`multilabel` (sigmoid per class, mAP), `contrastive` (CLIP / SigLIP on image-caption pairs), `distillation` (a
student taught by a frozen teacher), `pretrain` (DINO self-supervised pretraining: EMA teacher, multi-crop), `mae`
(masked-autoencoder pretraining), `segmentation` (a class per pixel: CE / Dice,
mIoU),
`registry` (the one place a config picks its task: task_for)."""

from .base import Evaluation, Task
from .classification import ClassificationTask
from .contrastive import ContrastiveTask
from .distillation import DistillationTask
from .mae import MAETask
from .multilabel import MultiLabelTask
from .pretrain import DinoTask
from .registry import TASKS, task_class, task_for, task_name
from .segmentation import SegmentationTask

__all__ = ["Task", "Evaluation", "ClassificationTask", "MultiLabelTask", "ContrastiveTask", "DistillationTask",
           "DinoTask", "MAETask", "SegmentationTask", "TASKS", "task_name", "task_class", "task_for"]
