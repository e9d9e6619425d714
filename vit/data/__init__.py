"""Data: image decoding (`decode`), the augmentation pipelines (`transforms`), the datasets and loaders of
every `data.dataset` (`datasets`; tar shards in `shards` + `shard_loader`, Hugging Face datasets in
`hf_datasets`) and generated images (`synthetic`)."""

from .datasets import (
    IMG_EXTENSIONS,
    ArrayDataset,
    DataError,
    EpochSampler,
    FolderDataset,
    absolute_root,
    build_datasets,
    build_loaders,
    resolve_data_config,
)
from .decode import BadImageError, decode_image
from .synthetic import colour_coded, photo_like
from .transforms import Pipeline, build_transform

__all__ = ["ArrayDataset", "FolderDataset", "EpochSampler", "build_datasets", "DataError", "IMG_EXTENSIONS",
           "resolve_data_config", "build_loaders", "absolute_root", "BadImageError", "decode_image", "photo_like",
           "colour_coded", "Pipeline", "build_transform"]
