"""The loaders train.py trains and scores with, and the class counts they balance by.

`EpochSampler` shuffles with a permutation that depends only on (seed, epoch), so resuming mid-epoch and
skipping the batches already seen reproduces the uninterrupted order exactly; data.sampler: balanced draws each
class equally often from the same (seed, epoch) stream, optim.class_weights: auto weighs the loss by the inverse
class frequency. The datasets themselves are `vit.data.datasets`'s (and shard_loader's for data.dataset: wds).
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..config import Config
from .base import DataError

__all__ = ["EpochSampler", "build_loaders", "train_labels", "class_counts", "class_weights"]


class EpochSampler(Sampler[int]):
    """Shuffled (or sequential) indices; the permutation depends only on (seed, epoch). With `weights` (one per
    sample): `n` draws with replacement, each index with probability proportional to its weight, also a
    function of (seed, epoch) only (data.sampler: balanced)."""

    def __init__(self, n: int, shuffle: bool = True, seed: int = 0, weights: torch.Tensor | None = None) -> None:
        self.n, self.shuffle, self.seed, self.epoch, self.weights = n, shuffle, seed, 0, weights

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if not self.shuffle:
            return iter(range(self.n))
        g = torch.Generator().manual_seed(self.seed * 7919 + self.epoch)
        if self.weights is not None:
            return iter(torch.multinomial(self.weights, self.n, replacement=True, generator=g).tolist())
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self) -> int:
        return self.n


def train_labels(ds: Dataset) -> list[int]:
    """The integer label of every sample of a single-label dataset (without reading an image)."""
    labels = getattr(ds, "labels", None)
    if labels is None:
        raise DataError(f"{type(ds).__name__} does not list its labels, which data.sampler=balanced and "
                        "optim.class_weights=auto need; remove them for this dataset.")
    return [int(y) for y in labels]


def class_counts(ds: Dataset) -> torch.Tensor:
    """Images per class (num_classes,) of a single-label dataset."""
    return torch.bincount(torch.as_tensor(train_labels(ds)), minlength=len(ds.classes))


def class_weights(cfg: Config, ds: Dataset) -> torch.Tensor | None:
    """optim.class_weights=auto: n / (num_classes * n_c) per class of the training split (a class with no image
    gets 0); None when unset."""
    if cfg.optim.class_weights != "auto":
        return None
    counts = class_counts(ds).double()
    w = torch.where(counts > 0, counts.sum() / (len(counts) * counts.clamp(min=1)), torch.zeros_like(counts))
    return w.float()


def build_loaders(cfg: Config, train_ds: Dataset, val_ds: Dataset, accelerator=None) -> tuple:
    """(train, val) DataLoaders for train.py, before `accelerator.prepare` shards them. The train loader
    shuffles through `EpochSampler` ((seed, epoch) permutation, so a mid-epoch resume skips exactly the batches
    already seen) and keeps a short last batch; the val loader keeps the dataset's order. For `data.dataset: wds`
    the shard loaders of vit/data/shard_loader.py, which deal shards to this process themselves (`accelerator`
    says which); `accelerator.prepare` leaves them alone (train.py prepares only DataLoaders)."""
    if cfg.data.dataset == "wds":
        from .shard_loader import build_wds_loaders

        return build_wds_loaders(cfg, train_ds, val_ds, accelerator)
    # Own generators: starting a loader then draws its worker seed from them, not from the global RNG that
    # drop path and mixup use, so a resumed run consumes the global RNG exactly as an uninterrupted one.
    seed, workers = cfg.run.seed, cfg.data.num_workers
    weights = None
    if cfg.data.sampler == "balanced":  # each class drawn equally often: weight 1 / (its count) per image
        counts = class_counts(train_ds)
        weights = (1.0 / counts.clamp(min=1).double())[torch.as_tensor(train_labels(train_ds))]
    order = EpochSampler(len(train_ds), shuffle=True, seed=seed, weights=weights)
    if cfg.data.naflex is not None:  # batches of as many images as the token budget holds (vit/data/naflex.py)
        from .naflex import BudgetBatchSampler, sequence_lengths

        nf = cfg.data.naflex
        lengths = sequence_lengths(train_ds, cfg.model.patch_size, nf.max_num_patches)
        batching = dict(batch_sampler=BudgetBatchSampler(
            lengths, nf.tokens_per_batch or cfg.data.batch_size * nf.max_num_patches, order))
    else:
        # image-caption pairs: every process must hold as many pairs (their negatives are gathered): no short batch
        batching = dict(batch_size=cfg.data.batch_size, drop_last=cfg.data.dataset == "captions", sampler=order)
    train = DataLoader(train_ds, **batching, num_workers=workers,
                       pin_memory=torch.cuda.is_available(), generator=torch.Generator().manual_seed(seed),
                       collate_fn=getattr(train_ds, "collate", None))  # text, NaFlex: padded per batch
    val = DataLoader(val_ds, batch_size=cfg.data.eval_batch_size or cfg.data.batch_size, shuffle=False,
                     num_workers=workers, generator=torch.Generator().manual_seed(seed),
                     collate_fn=getattr(val_ds, "collate", None))
    return train, val
