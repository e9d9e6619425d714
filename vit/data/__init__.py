"""Data: what every reader shares (`base`: DataError, seeded datasets, the ImageFolder conventions), image
decoding (`decode`), the augmentation pipelines (`transforms`), the datasets of every `data.dataset`
(`datasets`; tar shards in `shards` + `shard_samples` + `shard_loader`, Hugging Face datasets in `hf_datasets`,
multi-label labels files in `multilabel`, sentences in `text`, image-caption pairs in `captions`), train.py's
loaders (`loaders`), images at their own aspect ratio batched by token budget (`naflex`), unlabelled images and
DINO's multi-crop for pretraining (`pretrain`), the config completed from the data (`resolve`)
generated images (`synthetic`), image / mask pairs for segmentation (`segmentation`; where they come from:
`seg_pairs`; native-scale training windows: `seg_window`) and the colours a class mask is drawn in
(`mask_colours`).

The names below load on first use (PEP 562, as `vit/__init__.py` does), so `vit.data.decode` (NumPy, Pillow,
OpenCV) imports without torch: the torch-free predictor (`predict.py --onnx`) reads its images through it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {  # public name -> the module of this package that defines it
    **dict.fromkeys(("ArrayDataset", "FolderDataset", "build_datasets", "build_eval_split", "is_flat_folder",
                     "image_transform"), "datasets"),
    **dict.fromkeys(("EpochSampler", "build_loaders", "class_counts", "class_weights"), "loaders"),
    "DataError": "base",
    **dict.fromkeys(("absolute_root", "choose_channels", "data_channels", "resolve_data_config"), "resolve"),
    **dict.fromkeys(("MultiLabelDataset", "read_labels_file"), "multilabel"),
    **dict.fromkeys(("IMG_EXTENSIONS", "BadImageError", "decode_image"), "decode"),
    **dict.fromkeys(("colour_coded", "photo_like", "SHAPES", "long_tailed_colours", "shapes_image"), "synthetic"),
    **dict.fromkeys(("Pipeline", "build_transform"), "transforms"),
    **dict.fromkeys(("grid_for_budget", "patchify", "unpatchify", "build_naflex_transform", "collate_naflex",
                     "BudgetBatchSampler"), "naflex"),
}

__all__ = ["ArrayDataset", "FolderDataset", "EpochSampler", "build_datasets", "DataError", "IMG_EXTENSIONS",
           "resolve_data_config", "build_loaders", "absolute_root", "BadImageError", "decode_image", "photo_like",
           "colour_coded", "Pipeline", "build_transform", "build_eval_split", "choose_channels", "data_channels",
           "class_counts", "class_weights", "is_flat_folder", "MultiLabelDataset", "read_labels_file", "SHAPES",
           "shapes_image", "long_tailed_colours", "image_transform", "grid_for_budget", "patchify", "unpatchify",
           "build_naflex_transform", "collate_naflex", "BudgetBatchSampler"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # static checkers and IDEs see the eager imports
    from .base import DataError
    from .datasets import ArrayDataset, FolderDataset, build_datasets, build_eval_split, image_transform, is_flat_folder
    from .decode import IMG_EXTENSIONS, BadImageError, decode_image
    from .loaders import EpochSampler, build_loaders, class_counts, class_weights
    from .multilabel import MultiLabelDataset, read_labels_file
    from .naflex import (
        BudgetBatchSampler,
        build_naflex_transform,
        collate_naflex,
        grid_for_budget,
        patchify,
        unpatchify,
    )
    from .resolve import absolute_root, choose_channels, data_channels, resolve_data_config
    from .synthetic import SHAPES, colour_coded, long_tailed_colours, photo_like, shapes_image
    from .transforms import Pipeline, build_transform
