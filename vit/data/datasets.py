"""Datasets for training and evaluation: digits (the offline default), ImageFolder, CIFAR, synthetic.

Every dataset yields (image (C, S, S) float tensor, label int) through a `vit.data.transforms` pipeline and knows its
`classes`. Augmentation randomness is seeded per (seed, epoch, index): call `set_epoch` before each epoch.
`EpochSampler` shuffles with a permutation that depends only on (seed, epoch), so resuming mid-epoch and
skipping the batches already seen reproduces the uninterrupted order exactly.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..config import Config, ConfigError, check_data_sources
from .base import (
    IMG_EXTENSIONS,
    DataError,
    SeededDataset,
    check_classes,
    class_folders,
    folder_classes,
    image_files,
)
from .decode import BadImageError, decode_image
from .synthetic import colour_coded
from .transforms import build_transform

__all__ = ["ArrayDataset", "FolderDataset", "EpochSampler", "build_datasets", "DataError", "IMG_EXTENSIONS",
           "resolve_data_config", "build_loaders", "absolute_root"]
log = logging.getLogger(__name__)




class ArrayDataset(SeededDataset):
    """In-memory RGB uint8 images (N, H, W, 3) and integer labels."""

    def __init__(self, images: np.ndarray, labels: Sequence[int], classes, transform, seed: int = 0) -> None:
        super().__init__(transform, classes, seed)
        self.images, self.labels = images, [int(y) for y in labels]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.images[i], self.sample_seed(i)), self.labels[i]

    def describe(self, i: int) -> str:
        return str(i)


class FolderDataset(SeededDataset):
    """Images in `<root>/<class>/*`. Unreadable files found while loading are replaced by the next good one
    (and logged); `check()` finds them all before training starts."""

    def __init__(self, root: Path, classes: Sequence[str], transform, seed: int = 0) -> None:
        super().__init__(transform, classes, seed)
        self.root = Path(root)
        index = {c: i for i, c in enumerate(self.classes)}
        self.samples: list[tuple[Path, int]] = []
        for c in class_folders(self.root):
            if c not in index:
                raise DataError(f"{self.root / c} is a class the training split does not have; "
                                "every split needs the same class folders.")
            self.samples += [(p, index[c]) for p in sorted(image_files(self.root / c))]
        self.bad: list[str] = []

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def labels(self) -> list[int]:
        return [y for _, y in self.samples]

    def describe(self, i: int) -> str:
        return str(self.samples[i][0])

    def check(self, on_bad_image: str) -> list[str]:
        """Decode every file once; drop (skip) or refuse (error) the unreadable ones."""
        good, bad = [], []
        for path, y in self.samples:
            try:
                decode_image(path, max_side=64)
                good.append((path, y))
            except BadImageError as e:
                bad.append(str(e))
        if bad and on_bad_image == "error":
            raise DataError(f"{len(bad)} unreadable image(s) in {self.root}, first: {bad[0]}; remove them or "
                            "set data.on_bad_image=skip.")
        self.samples, self.bad = good, bad  # named once, by the caller (train.py's data line, evaluate.py)
        return bad

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        for k in range(len(self.samples)):
            path, y = self.samples[(i + k) % len(self.samples)]
            try:  # decoded at the smallest JPEG scale this sample's crop allows
                return self.transform.load(path, self.sample_seed(i)), y
            except BadImageError as e:  # a file that went bad after check(): never kill the epoch
                log.warning("skipping %s", e)
        raise DataError(f"no readable image left in {self.root}.")


class EpochSampler(Sampler[int]):
    """Shuffled (or sequential) indices; the permutation depends only on (seed, epoch)."""

    def __init__(self, n: int, shuffle: bool = True, seed: int = 0) -> None:
        self.n, self.shuffle, self.seed, self.epoch = n, shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if not self.shuffle:
            return iter(range(self.n))
        g = torch.Generator().manual_seed(self.seed * 7919 + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self) -> int:
        return self.n


# --- dataset builders ----------------------------------------------------------------------------------------


def _digits(cfg: Config):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    imgs = np.clip(d.images * 16, 0, 255).astype(np.uint8)  # (N, 8, 8), values 0..16 -> 0..255
    imgs = np.repeat(imgs[..., None], 3, axis=3)  # RGB, so every dataset shares one pipeline
    idx = np.arange(len(imgs))
    tr, va = train_test_split(idx, test_size=cfg.data.val_fraction, random_state=cfg.data.split_seed,
                              stratify=d.target)
    classes = [str(c) for c in d.target_names]
    return (imgs[tr], d.target[tr]), (imgs[va], d.target[va]), classes


def _cifar(cfg: Config, name: str):
    from torchvision import datasets

    root = Path(cfg.data.root or "data") / name
    cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
    try:
        tr = cls(str(root), train=True, download=cfg.data.download)
        va = cls(str(root), train=False, download=cfg.data.download)
    except (RuntimeError, OSError) as e:
        raise DataError(
            f"{name} is not in {root} and could not be downloaded ({str(e).splitlines()[0]}); put the extracted "
            f"'{'cifar-10-batches-py' if name == 'cifar10' else 'cifar-100-python'}' folder there, or go online."
        ) from None
    return (tr.data, tr.targets), (va.data, va.targets), list(tr.classes)


def _synthetic(cfg: Config, img_size: int):
    d = cfg.data
    tr, va = colour_coded(d.split_seed, d.synthetic_num_classes, (d.synthetic_train_size, d.synthetic_val_size),
                          img_size)
    return tr, va, [f"class_{i}" for i in range(d.synthetic_num_classes)]


def _check_no_class_emptied(ds: FolderDataset, d: Path) -> None:
    """A class whose every image was unreadable is refused, as an empty class folder is (folder_classes)."""
    left = set(ds.labels)
    for i, c in enumerate(ds.classes):
        if i not in left:
            first = next((b for b in ds.bad if str(d / c) in b), "")
            raise DataError(f"every image of class folder {d / c} is unreadable, so the class has none left"
                            + (f" (first: {first})" if first else "") + "; fix or replace them, or remove the folder.")


def absolute_root(root: str | None) -> str | None:
    """A local `data.root` that exists, as an absolute path (a relative one would break evaluate.py run from
    another directory); URLs, `pipe:` commands and paths that do not exist (the error names them) as given."""
    if not root or "://" in root or root.startswith("pipe:") or not Path(root).exists():
        return root
    return str(Path(root).absolute())


def resolve_data_config(cfg: Config, pretrained_cfg: dict | None = None, in_chans: int | None = None) -> Config:
    """`cfg` with the preprocessing it leaves unset (aug.mean, std, eval_crop_pct, interpolation: None) taken from
    `pretrained_cfg`, the pretrained weights' config, as timm's resolve_data_config: the data pipeline is told
    the preprocessing (a model's `pretrained_cfg`, or `vit.models.pretrained_cfg_of(cfg.model)` for the weights
    the config names) and never looks a model up; without one, the fallbacks of `AugConfig.resolved`.
    Everything comes back filled, so the saved config says what was used. `in_chans`: the channels of a model
    already built (one loaded by name, which decides them): the pipeline follows it, not the config's default."""
    if in_chans is not None and in_chans != cfg.model.in_chans:
        if in_chans not in (1, 3):
            raise ConfigError(f"the model takes {in_chans} input channels, but the image pipelines give 3 (RGB) or "
                              "1 (grey); use a model built for one of those.")
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, in_chans=in_chans))
    return dataclasses.replace(cfg, aug=cfg.aug.resolved(pretrained_cfg, cfg.model.in_chans))


def _held_out_split(cfg: Config, root: Path, classes: list[str], t_train, t_val, seed: int) -> dict:
    """An ImageFolder without val/: hold out data.val_fraction of train/ with the seeded, stratified split the
    digits use (scikit-learn's train_test_split, random_state=data.split_seed), so every class keeps its share
    in both halves and evaluate.py, rebuilding it from the saved config, scores the same held-out images."""
    from sklearn.model_selection import train_test_split

    train = FolderDataset(root / "train", classes, t_train, seed)
    val = FolderDataset(root / "train", classes, t_val, seed)
    labels = np.array(train.labels)
    counts = np.bincount(labels, minlength=len(classes))
    n_val = int(np.ceil(cfg.data.val_fraction * len(labels)))
    if cfg.data.val_fraction <= 0 or counts.min() < 2 or n_val < len(classes) or len(labels) - n_val < len(classes):
        small = classes[int(counts.argmin())]
        raise DataError(f"{root} has no val/ folder, and holding out data.val_fraction={cfg.data.val_fraction} of "
                        f"train/ ({len(labels)} images; class '{small}' has {counts.min()}) cannot leave every class "
                        "in both splits; add a val/ folder, more images per class, or set a data.val_fraction "
                        "that does.")
    tr, va = train_test_split(np.arange(len(labels)), test_size=cfg.data.val_fraction,
                              random_state=cfg.data.split_seed, stratify=labels)
    train.samples = [train.samples[i] for i in sorted(tr)]
    val.samples = [val.samples[i] for i in sorted(va)]
    log.info("%s has no val/ folder: holding out a stratified %g of train/ (data.val_fraction, data.split_seed=%d): "
             "%d train / %d val images", root, cfg.data.val_fraction, cfg.data.split_seed, len(train), len(val))
    return {"train": train, "val": val}


def build_datasets(cfg: Config, check_images: bool = True, splits: tuple[str, ...] = ("train", "val"),
                   classes: list[str] | None = None):
    """(train, val, class names) for `cfg.data`, with the augmentation pipelines attached. A split left out of
    `splits` comes back as None (evaluation builds only val). `classes` (a checkpoint's) fixes the label order;
    a dataset whose classes differ raises DataError before any image is read."""
    check_data_sources(cfg)  # a pipe: or URL source from a checkpoint's saved config: refused before anything opens
    size, seed = cfg.model.img_size, cfg.run.seed
    t_train, t_val = build_transform(cfg.aug, size, True), build_transform(cfg.aug, size, False)
    name = cfg.data.dataset
    if name == "wds":  # tar shards (vit/data/shard_loader.py)
        from .shard_loader import build_wds_datasets

        return build_wds_datasets(cfg, t_train, t_val, splits, classes)
    if name == "hf":  # a Hugging Face dataset saved on disk (vit/data/hf_datasets.py)
        from .hf_datasets import build_hf_datasets

        return build_hf_datasets(cfg, t_train, t_val, splits, classes)
    if name == "imagefolder":
        root = Path(cfg.data.root)
        if not root.is_dir():
            raise DataError(f"data.root {root} does not exist; point it at a folder with train/ (and val/, or a share "
                            "of train/ is held out: data.val_fraction).")
        held_out = not (root / "val").is_dir() and (root / "train").is_dir()  # no val/: split train/ as digits
        found = folder_classes(root, "train") if "train" in splits or held_out else folder_classes(root, "val")
        classes = check_classes(classes, found)
        out = {k: v for k, v in _held_out_split(cfg, root, classes, t_train, t_val, seed).items()
               if k in splits} if held_out else {}
        for split, t in (("train", t_train), ("val", t_val)):
            if split in splits:
                if not held_out:
                    folder_classes(root, split)
                    out[split] = FolderDataset(root / split, classes, t, seed)
                if check_images:
                    out[split].check(cfg.data.on_bad_image)
                    if not len(out[split]):  # training on nothing "succeeds"; evaluating on nothing fails late
                        raise DataError(f"no usable image in {root / split}: all {len(out[split].bad)} are "
                                        f"unreadable (first: {out[split].bad[0]}); fix or replace them.")
                    _check_no_class_emptied(out[split], root / ("train" if held_out else split))
        return out.get("train"), out.get("val"), classes
    given = classes
    if name == "digits":
        tr, va, classes = _digits(cfg)
    elif name in ("cifar10", "cifar100"):
        tr, va, classes = _cifar(cfg, name)
    else:
        tr, va, classes = _synthetic(cfg, size)
    checked = check_classes(given, classes)
    if checked != classes:  # same names in another order: relabel to the checkpoint's indices
        remap = np.array([checked.index(c) for c in classes])
        tr, va = (tr[0], remap[np.asarray(tr[1])]), (va[0], remap[np.asarray(va[1])])
    classes = checked
    return (ArrayDataset(tr[0], tr[1], classes, t_train, seed), ArrayDataset(va[0], va[1], classes, t_val, seed),
            classes)


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
    train = DataLoader(train_ds, batch_size=cfg.data.batch_size, drop_last=False, num_workers=workers,
                       sampler=EpochSampler(len(train_ds), shuffle=True, seed=seed),
                       pin_memory=torch.cuda.is_available(), generator=torch.Generator().manual_seed(seed))
    val = DataLoader(val_ds, batch_size=cfg.data.eval_batch_size or cfg.data.batch_size, shuffle=False,
                     num_workers=workers, generator=torch.Generator().manual_seed(seed))
    return train, val
