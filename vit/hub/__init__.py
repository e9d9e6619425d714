"""Pretrained weights by name: `names` turns a model name, tag, `hf-hub:` or `local-dir:` into a `Source`;
`weights` reads and adapts a state dict without running code."""

from .names import WEIGHT_FILES, Source, hub_cache_dir, resolve, resolve_source, timm_config, weights_file
from .weights import LoadReport, load_pretrained, read_state_dict

__all__ = ["Source", "resolve", "resolve_source", "weights_file", "hub_cache_dir", "timm_config", "WEIGHT_FILES",
           "load_pretrained", "read_state_dict", "LoadReport"]
