"""Datasets for training and evaluation: digits (the offline default), ImageFolder, CIFAR, synthetic.

Every dataset yields (image (C, S, S) float tensor, label int) through a `vit.data.transforms` pipeline and knows its
`classes`. Augmentation randomness is seeded per (seed, epoch, index): call `set_epoch` before each epoch. The
loaders that order them by (seed, epoch) are `vit.data.loaders`'s.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..config import Config, check_data_sources
from .base import (
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

__all__ = ["ArrayDataset", "FolderDataset", "build_datasets", "is_flat_folder", "build_eval_split", "image_transform",
           "with_naflex_collate"]
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

    @classmethod
    def listed(cls, root: Path, samples: list[tuple[Path, int]], transform, seed: int = 0) -> FolderDataset:
        """Images named by a file rather than found in class folders (vit/data/captions.py): samples [(path,
        label)], read and checked as a folder's."""
        ds = cls.__new__(cls)
        SeededDataset.__init__(ds, transform, [], seed)
        ds.root, ds.samples, ds.bad = Path(root), list(samples), []
        return ds

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


def is_flat_folder(root: Path) -> bool:
    """torchvision's ImageFolder layout, root/<class>/*: no train/ or val/ folder, and class folders that hold
    images directly (a root whose only folders are splits, e.g. test/, is not flat)."""
    if (root / "train").is_dir() or (root / "val").is_dir() or not root.is_dir():
        return False
    names = class_folders(root)
    return bool(names) and any(next(image_files(root / c), None) is not None for c in names) and not all(
        c in ("test", "valid", "validation") for c in names)


def _check_no_class_emptied(ds: FolderDataset, d: Path) -> None:
    """A class whose every image was unreadable is refused, as an empty class folder is (folder_classes)."""
    left = set(ds.labels)
    for i, c in enumerate(ds.classes):
        if i not in left:
            first = next((b for b in ds.bad if str(d / c) in b), "")
            raise DataError(f"every image of class folder {d / c} is unreadable, so the class has none left"
                            + (f" (first: {first})" if first else "") + "; fix or replace them, or remove the folder.")


def _held_out_split(cfg: Config, root: Path, classes: list[str], t_train, t_val, seed: int,
                    train_dir: Path | None = None) -> dict:
    """An ImageFolder without val/: hold out data.val_fraction of train/ (`train_dir`: root itself for the flat
    root/<class>/* layout) with the seeded, stratified split the digits use (scikit-learn's train_test_split,
    random_state=data.split_seed), so every class keeps its share in both halves and evaluate.py, rebuilding it
    from the saved config, scores the same held-out images."""
    from sklearn.model_selection import train_test_split

    train_dir = train_dir or root / "train"
    train = FolderDataset(train_dir, classes, t_train, seed)
    val = FolderDataset(train_dir, classes, t_val, seed)
    labels = np.array(train.labels)
    counts = np.bincount(labels, minlength=len(classes))
    n_val = int(np.ceil(cfg.data.val_fraction * len(labels)))
    if cfg.data.val_fraction <= 0 or counts.min() < 2 or n_val < len(classes) or len(labels) - n_val < len(classes):
        small = classes[int(counts.argmin())]
        of = "train/" if train_dir == root / "train" else "its images"
        raise DataError(f"{root} has no val/ folder, and holding out data.val_fraction={cfg.data.val_fraction} of "
                        f"{of} ({len(labels)} images; class '{small}' has {counts.min()}) cannot leave every class "
                        "in both splits; add a val/ folder, more images per class, or set a data.val_fraction "
                        "that does.")
    tr, va = train_test_split(np.arange(len(labels)), test_size=cfg.data.val_fraction,
                              random_state=cfg.data.split_seed, stratify=labels)
    train.samples = [train.samples[i] for i in sorted(tr)]
    val.samples = [val.samples[i] for i in sorted(va)]
    log.info("%s has no val/ folder: holding out a stratified %g of its images (data.val_fraction, "
             "data.split_seed=%d): %d train / %d val images", root, cfg.data.val_fraction, cfg.data.split_seed,
             len(train), len(val))
    return {"train": train, "val": val}


def _caption_datasets(cfg: Config, check_images: bool, t_train, t_val):
    """data.dataset: captions: image-caption pairs from contrastive.captions_file, or an image folder whose
    classes give each image its caption through contrastive.template (vit/data/captions.py)."""
    from .captions import caption_datasets, pair_samples

    if not cfg.contrastive.captions_file:  # an image folder: each class's caption from the template
        folder = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, dataset="imagefolder"))
        train, val, classes = build_datasets(folder, check_images)
        captions = [cfg.contrastive.template.format(c) for c in classes]
        return caption_datasets(cfg, {"train": train, "val": val}, captions, classes)
    samples, captions = pair_samples(cfg)
    parts = {s: FolderDataset.listed(cfg.data.root, samples[s], t, cfg.run.seed)
             for s, t in (("train", t_train), ("val", t_val))}
    for ds in parts.values():
        if check_images:
            ds.check(cfg.data.on_bad_image)
    return caption_datasets(cfg, parts, captions, [])


def _folder_datasets(cfg: Config, check_images: bool, splits: tuple[str, ...], classes: list[str] | None,
                     t_train, t_val):
    """data.dataset: imagefolder: root/train/<class>/* and root/val/<class>/*, or a held-out share of train/ (or
    of a flat root/<class>/*) when there is no val/."""
    root = Path(cfg.data.root)
    if not root.is_dir():
        raise DataError(f"data.root {root} does not exist; point it at a folder with train/ (and val/, or a share "
                        "of train/ is held out: data.val_fraction).")
    flat = is_flat_folder(root)  # torchvision's root/<class>/*: held out as a folder without val/
    held_out = flat or (not (root / "val").is_dir() and (root / "train").is_dir())  # no val/: split train/
    found = class_folders(root) if flat else (
        folder_classes(root, "train") if "train" in splits or held_out else folder_classes(root, "val"))
    classes = check_classes(classes, found)
    out = {k: v for k, v in _held_out_split(cfg, root, classes, t_train, t_val, cfg.run.seed,
                                            root if flat else None).items() if k in splits} if held_out else {}
    for split, t in (("train", t_train), ("val", t_val)):
        if split in splits:
            if not held_out:
                folder_classes(root, split)
                out[split] = FolderDataset(root / split, classes, t, cfg.run.seed)
            if check_images:
                out[split].check(cfg.data.on_bad_image)
                if not len(out[split]):  # training on nothing "succeeds"; evaluating on nothing fails late
                    raise DataError(f"no usable image in {root / split}: all {len(out[split].bad)} are "
                                    f"unreadable (first: {out[split].bad[0]}); fix or replace them.")
                _check_no_class_emptied(out[split], root if flat else root / ("train" if held_out else split))
    out = out.get("train"), out.get("val"), classes
    return with_naflex_collate(*out) if cfg.data.naflex is not None else out


def build_datasets(cfg: Config, check_images: bool = True, splits: tuple[str, ...] = ("train", "val"),
                   classes: list[str] | None = None):
    """(train, val, class names) for `cfg.data`, with the augmentation pipelines attached. A split left out of
    `splits` comes back as None (evaluation builds only val). `classes` (a checkpoint's) fixes the label order;
    a dataset whose classes differ raises DataError before any image is read."""
    check_data_sources(cfg)  # a pipe: or URL source from a checkpoint's saved config: refused before anything opens
    size, seed = cfg.model.img_size, cfg.run.seed
    t_train, t_val = image_transform(cfg, True), image_transform(cfg, False)
    name = cfg.data.dataset
    if name == "wds":  # tar shards (vit/data/shard_loader.py)
        from .shard_loader import build_wds_datasets

        return build_wds_datasets(cfg, t_train, t_val, splits, classes)
    if name == "hf":  # a Hugging Face dataset saved on disk (vit/data/hf_datasets.py)
        from .hf_datasets import build_hf_datasets

        return build_hf_datasets(cfg, t_train, t_val, splits, classes)
    if name == "text_csv":  # sentences and labels, tokenised (vit/data/text.py)
        from .text import build_text_datasets

        return build_text_datasets(cfg, splits, classes)
    if name == "segmentation":  # image / mask pairs (vit/data/segmentation.py)
        from .segmentation import build_seg_datasets

        train, val, classes = build_seg_datasets(cfg, splits, classes, val_files=True)  # val scored as predicted
        for ds in (train, val) if check_images else ():  # a bad mask or image found now, not in the first epoch
            if ds is not None:
                ds.check(cfg.data.on_bad_image)
        return train, val, classes
    if name == "captions":  # image-caption pairs for a CLIP model (vit/data/captions.py)
        return _caption_datasets(cfg, check_images, t_train, t_val)
    if name == "imagefolder" and cfg.data.labels_file:  # multi-label: images and labels from a file
        from .multilabel import build_multilabel_datasets

        return build_multilabel_datasets(cfg, t_train, t_val, splits, classes)
    if name == "imagefolder":
        return _folder_datasets(cfg, check_images, splits, classes, t_train, t_val)
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
    out = ArrayDataset(tr[0], tr[1], classes, t_train, seed), ArrayDataset(va[0], va[1], classes, t_val, seed), classes
    return with_naflex_collate(*out) if cfg.data.naflex is not None else out


def image_transform(cfg: Config, train: bool):
    """The pipeline of one split: `build_transform` for square model.img_size inputs, or NaFlex's (each image at
    its own aspect ratio, patchified; vit/data/naflex.py) with data.naflex, cut in model.patch_size patches."""
    if cfg.data.naflex is None:
        return build_transform(cfg.aug, cfg.model.img_size, train)
    from .naflex import build_naflex_transform

    if not cfg.model.patch_size:
        raise DataError("data.naflex cuts images into the model's patches, and model.patch_size is not set; set it "
                        "(train.py fills it from model.name).")
    return build_naflex_transform(cfg.aug, cfg.model.patch_size, cfg.data.naflex.max_num_patches, train)


def with_naflex_collate(train, val, classes):
    """(train, val, classes) with NaFlex's padding collate on each dataset given (the loaders' collate_fn)."""
    from .naflex import collate_naflex

    for ds in (train, val):
        if ds is not None:
            ds.collate = collate_naflex
    return train, val, classes


def build_eval_split(cfg: Config, split: str = "val", folder: str | None = None,
                     classes: list[str] | None = None) -> tuple[Dataset, list[str], str]:
    """(dataset, class names, what it is) for evaluate.py: `folder` (any <class>/* folder, scored whole), or
    the config's data in split `split`: val (the held-out split train.py scored), train (the training images,
    without augmentation), or any other split the data has (an ImageFolder's root/<split>/<class>/*, a labels
    file's split column, a shard or Hugging Face split name). `classes` (a checkpoint's) fixes the label order."""
    if cfg.data.dataset == "text_csv":  # sentences: the CSV's train, val or test rows (vit/data/text.py)
        from .text import build_text_datasets

        if folder is not None:
            raise DataError("--data-dir is a folder of images; score another CSV of sentences with "
                            "--data.root=FILE.csv instead.")
        train, val, classes = build_text_datasets(cfg, (split,), classes)
        ds = train if split == "train" else val
        return ds, classes, f"text_csv {cfg.data.root}, split {split} ({len(ds)} texts)"
    t_val = image_transform(cfg, False)
    name = cfg.data.dataset
    if folder is not None or (name == "imagefolder" and not cfg.data.labels_file and split not in ("train", "val")):
        d = Path(folder) if folder is not None else Path(cfg.data.root) / split
        if not d.is_dir():
            raise DataError(f"{d} is not a folder; pass a folder of <class>/ image folders" + (
                "" if folder is not None else f" (--split {split} reads data.root/{split}/<class>/*)") + ".")
        found = class_folders(d)
        if not found:
            raise DataError(f"{d} has no class folders; put images in {d}/<class_name>/.")
        classes = check_classes(classes, found)
        ds = FolderDataset(d, classes, t_val, cfg.run.seed)
        if cfg.data.naflex is not None:
            with_naflex_collate(None, ds, classes)
        ds.check(cfg.data.on_bad_image)
        if not len(ds):
            raise DataError(f"no usable image in {d}" + (f" (first unreadable: {ds.bad[0]})" if ds.bad else "") +
                            "; put images in its class folders.")
        return ds, classes, f"folder {d} ({len(ds)} images)"
    if split != "val" and name in ("wds", "hf"):  # a split by name, read as the held-out one (in order)
        named = cfg.data.train_split if split == "train" else split
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, val_split=named))
        _, val, classes = build_datasets(cfg, check_images=True, splits=("val",), classes=classes)
        return val, classes, f"{name} {cfg.data.root}, split {named} ({len(val)} images)"
    elif split not in ("train", "val") and not cfg.data.labels_file:
        raise DataError(f"--split {split}: {name} data has only the train and val splits; pass --split val or "
                        "train, or --data-dir FOLDER.")
    train, val, classes = build_datasets(cfg, check_images=True, splits=("train", "val") if split == "train"
                                         else (split,) if cfg.data.labels_file else ("val",), classes=classes)
    ds = train if split == "train" else val
    if split == "train":
        ds.transform = t_val  # the training images as evaluation sees them: no augmentation
    where = {"imagefolder": cfg.data.root, "wds": cfg.data.root, "hf": cfg.data.root}.get(name, name)
    return ds, classes, f"{name} {where}, split {split} ({len(ds)} images)"


