"""Data: image decoding (`decode`), the augmentation pipelines (`transforms`), the datasets and loaders of
every `data.dataset` (`datasets`; tar shards in `shards` + `shard_loader`, Hugging Face datasets in
`hf_datasets`, multi-label labels files in `multilabel`) and generated images (`synthetic`)."""

from .datasets import (
    IMG_EXTENSIONS,
    ArrayDataset,
    DataError,
    EpochSampler,
    FolderDataset,
    absolute_root,
    build_datasets,
    build_eval_split,
    build_loaders,
    choose_channels,
    class_counts,
    class_weights,
    data_channels,
    is_flat_folder,
    resolve_data_config,
)
from .decode import BadImageError, decode_image
from .multilabel import MultiLabelDataset, read_labels_file
from .synthetic import SHAPES, colour_coded, long_tailed_colours, photo_like, shapes_image
from .transforms import Pipeline, build_transform

__all__ = ["ArrayDataset", "FolderDataset", "EpochSampler", "build_datasets", "DataError", "IMG_EXTENSIONS",
           "resolve_data_config", "build_loaders", "absolute_root", "BadImageError", "decode_image", "photo_like",
           "colour_coded", "Pipeline", "build_transform", "build_eval_split", "choose_channels", "data_channels",
           "class_counts", "class_weights", "is_flat_folder", "MultiLabelDataset", "read_labels_file", "SHAPES",
           "shapes_image", "long_tailed_colours"]
