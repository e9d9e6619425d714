"""The k-NN monitor of a pretraining run (pretrain.knn_root): a self-supervised backbone has no labels to be scored
on, so, as DINO's training watches ImageNet k-NN accuracy, a folder of a few labelled images (train/<class>/ and
val/<class>/, as an ImageFolder) scores it at every evaluation: the weighted k-NN vote of the student's pooled
features (vit.eval.probes.knn_scores, k 20, T 0.07: DINO's eval_knn settings), the val/ images against the train/
ones, top-1 in the console and metrics.csv's val_knn. Every process scores the whole folder (a few hundred images),
so the number is the same on each without a gather."""

from __future__ import annotations

from pathlib import Path

import torch

from ..data.base import DataError, folder_classes
from ..data.datasets import FolderDataset
from ..data.transforms import build_transform
from ..eval.probes import knn_scores

__all__ = ["KnnMonitor", "K", "TEMPERATURE", "with_knn"]

K, TEMPERATURE = 20, 0.07


class KnnMonitor:
    """Built from the config before the first step (a folder that is not train/ and val/ class folders of images is
    one DataError sentence); called with the eval model, it gives the k-NN top-1 in [0, 1]."""

    def __init__(self, cfg) -> None:
        root = Path(cfg.pretrain.knn_root)
        if not root.is_dir():
            what = "is a file, not a folder" if root.exists() else "does not exist"
            raise DataError(f"pretrain.knn_root {root} {what}; point it at a few labelled images in "
                            "train/<class>/ and val/<class>/ folders, or set it to null.")
        self.classes = folder_classes(root, "train")
        if folder_classes(root, "val") != self.classes:
            raise DataError(f"pretrain.knn_root {root}: val/ has the classes {folder_classes(root, 'val')} and "
                            f"train/ {self.classes}; give both the same class folders.")
        t = build_transform(cfg.aug, cfg.model.img_size, train=False)
        self.train, self.val = (FolderDataset(root / s, self.classes, t, cfg.run.seed) for s in ("train", "val"))
        for ds in (self.train, self.val):
            ds.check("error")
        self.batch_size = cfg.data.batch_size

    @torch.no_grad()
    def features(self, model: torch.nn.Module, dataset, accelerator) -> tuple[torch.Tensor, torch.Tensor]:
        """(pooled features (N, D) in float32, labels (N,)) of every image of `dataset`, in order."""
        loader = torch.utils.data.DataLoader(dataset, batch_size=self.batch_size, shuffle=False)
        feats, labels = [], []
        for x, y in loader:
            with accelerator.autocast():
                feats.append(model(x.to(accelerator.device)).float().cpu())
            labels.append(y)
        return torch.cat(feats), torch.cat(labels)

    def scores(self, model: torch.nn.Module, accelerator) -> tuple[torch.Tensor, torch.Tensor]:
        """(the k-NN class scores of the val/ images (N, classes), their labels (N,))."""
        train_x, train_y = self.features(model, self.train, accelerator)
        val_x, val_y = self.features(model, self.val, accelerator)
        return knn_scores(train_x, train_y, val_x, len(self.classes), K, TEMPERATURE), val_y

    def __call__(self, model: torch.nn.Module, accelerator) -> float:
        scores, val_y = self.scores(model, accelerator)
        return (scores.argmax(1) == val_y).double().mean().item()


def with_knn(evaluation, monitor: KnnMonitor | None, model: torch.nn.Module, accelerator):
    """`evaluation` (a task's Evaluation) with the monitor's top-1 added to its line, row and meta as val_knn; the
    same evaluation without a monitor."""
    if monitor is None:
        return evaluation
    top1 = monitor(model, accelerator)
    evaluation.line += f"  val k-NN top-1 {100 * top1:.1f}%"
    evaluation.row["val_knn"] = evaluation.meta["val_knn"] = top1
    return evaluation
