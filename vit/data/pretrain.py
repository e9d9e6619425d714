"""Unlabelled images for self-supervised pretraining (pretrain.method; vit/train/tasks/pretrain.py): every image
file under data.root whatever its layout (class folders, train/ and val/, a flat folder: labels and splits are
ignored), or the digits' images without their labels.

DINO's multi-crop (Caron et al. 2021, section 3.1): each image gives 2 global crops covering [global_scale, 1] of
it at model.img_size and `local_crops` local ones covering [0.05, global_scale] at pretrain.local_size, each crop
its own draw of the training augmentation (flip, affine jitter, colour jitter as aug.* sets them), seeded per
(seed, epoch, index, crop) as every reader here. A sample is (list of crop tensors, 0), so the default collate
batches it as one tensor per crop. MAE reads one training view, (tensor, 0).
The held-out images (the feature statistics of an evaluation) are a fixed, seeded share: data.val_fraction.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from ..config import Config
from .base import DataError, image_files
from .datasets import ArrayDataset, FolderDataset
from .decode import decode_image
from .transforms import Pipeline, build_transform

__all__ = ["MultiCrop", "unlabelled_files", "build_pretrain_datasets"]

LOCAL_MIN_SCALE = 0.05  # DINO's smallest local crop (a share of the image's area)


class MultiCrop:
    """Pipelines applied to one decoded image, each with its own seed; `load(path, seed)` and `__call__(image,
    seed)` as a `Pipeline`, returning the list of crops."""

    def __init__(self, pipelines: list[Pipeline]) -> None:
        self.pipelines = pipelines

    def __call__(self, image: np.ndarray, seed: int | None = None) -> list[torch.Tensor]:
        base = 0 if seed is None else seed
        return [p(image, (base * 31 + k) % 2**31) for k, p in enumerate(self.pipelines)]

    def load(self, path: str | Path, seed: int | None = None) -> list[torch.Tensor]:
        return self(decode_image(path), seed)


def multi_crop(cfg: Config) -> MultiCrop:
    """DINO's crops from the config: 2 global, pretrain.local_crops local (module docstring)."""
    p, aug = cfg.pretrain, cfg.aug
    glob = dataclasses.replace(aug, random_resized_crop=True, scale=[p.global_scale, 1.0])
    local = dataclasses.replace(aug, random_resized_crop=True, scale=[LOCAL_MIN_SCALE, p.global_scale])
    return MultiCrop([build_transform(glob, cfg.model.img_size, True) for _ in range(2)]
                     + [build_transform(local, p.local_size, True) for _ in range(p.local_crops)])


def unlabelled_files(root: Path) -> list[Path]:
    """Every image file under `root`, sorted; one sentence when the folder is missing or holds none."""
    if not root.is_dir():
        raise DataError(f"data.root {root} is not a folder; point it at the folder of unlabelled images to pretrain "
                        "on (any layout).")
    files = sorted(image_files(root))
    if not files:
        raise DataError(f"data.root {root} holds no image file (.png, .jpg, ...), so there is nothing to pretrain "
                        "on; point it at a folder of images.")
    return files


def build_pretrain_datasets(cfg: Config, check_images: bool = True):
    """(train, held-out, []) for pretrain.method: the train images through DINO's crops or one MAE view; the
    held-out share (data.val_fraction, seeded by data.split_seed) through the evaluation pipeline."""
    t_train = multi_crop(cfg) if cfg.pretrain.method == "dino" else build_transform(cfg.aug, cfg.model.img_size, True)
    t_val = build_transform(cfg.aug, cfg.model.img_size, False)
    if cfg.data.dataset == "digits":
        from sklearn.datasets import load_digits

        imgs = np.clip(load_digits().images * 16, 0, 255).astype(np.uint8)
        imgs = np.repeat(imgs[..., None], 3, axis=3)  # RGB, as vit.data's digits
        items: list = list(imgs)
    else:
        items = unlabelled_files(Path(cfg.data.root))
    order = np.random.default_rng(cfg.data.split_seed).permutation(len(items))
    n_val = int(round(cfg.data.val_fraction * len(items))) if len(items) > 1 else 0
    val_idx, train_idx = sorted(order[:n_val]), sorted(order[n_val:])
    if cfg.data.dataset == "digits":
        make = lambda idx, t: ArrayDataset(imgs[idx], [0] * len(idx), [], t, cfg.run.seed)  # noqa: E731
    else:
        make = lambda idx, t: FolderDataset.listed(Path(cfg.data.root), [(items[i], 0) for i in idx],  # noqa: E731
                                                   t, cfg.run.seed)
    train, val = make(train_idx, t_train), make(val_idx, t_val)
    if check_images and cfg.data.dataset != "digits":
        for ds in (train, val):
            ds.check(cfg.data.on_bad_image)
        if not len(train):
            raise DataError(f"no usable image in {cfg.data.root}: all {len(train.bad)} are unreadable (first: "
                            f"{train.bad[0]}); fix or replace them.")
    return train, val, []
