"""Pretrained weights by name: `names` turns a model name, tag, `hf-hub:` or `local-dir:` into a `Source`,
whose files `cache` finds in the Hugging Face hub cache (downloaded only when online); `weights` reads and adapts
a state dict without running code; `hub_config` writes timm's config.json for our checkpoints. For text models:
`text_weights` renames transformers' BERT / DistilBERT / CLIP-text state dicts to ours, `tokenizer` loads a
repository's tokenizer.json, `clip_tokenizer` turns captions into open_clip's ids. Image towers in other layouts:
`hf_vision` (transformers' ViT, DeiT, DINOv2, CLIP and SigLIP vision models) and `open_clip_weights` (open_clip's
`visual.*`), converted to timm's ViT options and names; `qkv` fuses separate query / key / value projections into
timm's qkv."""

from .cache import hub_cache_dir
from .hub_config import split_tag, timm_config
from .names import (
           WEIGHT_FILES,
           Source,
           read_json,
           repo_file,
           resolve,
           resolve_source,
           weights_architecture,
           weights_file,
)
from .text_weights import text_state_dict
from .tokenizer import Tokenizer, load_tokenizer
from .weights import LoadReport, check_fit, converted_state_dict, load_pretrained, read_state_dict, timm_weights

__all__ = ["Source", "resolve", "resolve_source", "weights_architecture", "weights_file", "hub_cache_dir",
           "WEIGHT_FILES", "timm_config", "split_tag", "load_pretrained", "read_state_dict", "LoadReport", "check_fit",
           "repo_file", "read_json", "text_state_dict", "Tokenizer", "load_tokenizer",
           "converted_state_dict", "timm_weights"]
