"""Pretrained weights by name: `names` turns a model name, tag, `hf-hub:` or `local-dir:` into a `Source`;
`weights` reads and adapts a state dict without running code; `hub_config` writes timm's config.json for our
checkpoints."""

from .hub_config import split_tag, timm_config
from .names import WEIGHT_FILES, Source, hub_cache_dir, resolve, resolve_source, weights_file
from .weights import LoadReport, load_pretrained, read_state_dict

__all__ = ["Source", "resolve", "resolve_source", "weights_file", "hub_cache_dir", "WEIGHT_FILES", "timm_config",
           "split_tag", "load_pretrained", "read_state_dict", "LoadReport"]
