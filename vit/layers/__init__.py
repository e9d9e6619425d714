"""Building blocks of the shared Transformer encoder, one concept per module: `attention` (multi-head attention, fused
through `sdpa` or explicit for maps), `linear_attention` (Dinomaly's decoder) and `attention_pool` (MAP pooling); the
block's optional `block_parts`, `layer_scale`, `drop` (stochastic depth), `norm` and `mlp` (GELU, gated); the
embeddings `patch_embed`, `hybrid_embed` (a convolutional stem), `naflex` (images at their own aspect ratio),
`prefix_tokens` and the positions `pos_embed`, `rope` and `rel_pos`; the `pooling` heads; `token_reduction` (ToMe,
EViT); `sparse_attention` with its `sparse_gates` and `sparse_kernels`; `diff_attention` (differential attention);
`windowed_attention` (SAM's windows and decomposed relative positions); `dino_head` (DINO's projection head,
weight-normalised last layer); the segmentation heads `seg_heads` (linear, DPT); and `combinations`, the one table
of features that do not go together."""

from ..config import SparseOptions
from .attention import Attention, CachedSelfAttention, CrossAttention, attention_options
from .attention_pool import AttentionPoolLatent
from .block_parts import BlockParts
from .combinations import CONFLICTS, check_combination
from .diff_attention import DiffAttention, diff_lambda, diff_lambda_init, differential_attend, lambda_parameters
from .dino_head import DINOHead
from .drop import DropPath
from .hybrid_embed import HybridEmbed, Stem, patch_embedding
from .layer_scale import LayerScale
from .linear_attention import LinearAttention
from .mlp import MLP_LAYERS, GELUTanh, GluMlp, Mlp, QuickGELU, SwiGLU, get_mlp_layer
from .naflex import (
    NaFlex,
    NaFlexEmbeds,
    PatchGrid,
    check_batch,
    key_padding_mask,
    naflex_grids,
    naflex_rope_table,
    patchify,
)
from .norm import LayerNorm2d, get_norm_layer
from .patch_embed import PatchEmbed, to_2tuple
from .pooling import POOL_KINDS, Pooling, pool_tokens
from .pos_embed import add_pos_embed_1d, resample_abs_pos_embed, sincos_1d, sincos_2d
from .prefix_tokens import PrefixTokens
from .rel_pos import RelPos, rel_pos_layers
from .rope import MixedRotaryEmbedding, Rope, RotaryEmbedding, apply_rope, rope_table, rotary_embedding
from .sdpa import attend, expand_mask, merge_heads, sdpa_mask, split_heads
from .sparse_attention import (
    SparseAttention,
    indexer_loss,
    set_indexer_stage,
)
from .token_reduction import TokenState, build_token_reduction, parse_token_reduction, topk_warmup
from .windowed_attention import WindowedAttention, decomposed_rel_pos, window_partition, window_unpartition

__all__ = [
    "CONFLICTS",
    "check_combination",
    "Attention",
    "attention_options",
    "AttentionPoolLatent",
    "BlockParts",
    "CachedSelfAttention",
    "CrossAttention",
    "DiffAttention",
    "DINOHead",
    "DropPath",
    "GELUTanh",
    "GluMlp",
    "HybridEmbed",
    "LayerNorm2d",
    "LayerScale",
    "LinearAttention",
    "MLP_LAYERS",
    "MixedRotaryEmbedding",
    "Mlp",
    "NaFlex",
    "NaFlexEmbeds",
    "POOL_KINDS",
    "PatchEmbed",
    "PatchGrid",
    "Pooling",
    "PrefixTokens",
    "QuickGELU",
    "RelPos",
    "Rope",
    "RotaryEmbedding",
    "SparseAttention",
    "SparseOptions",
    "Stem",
    "SwiGLU",
    "TokenState",
    "WindowedAttention",
    "add_pos_embed_1d",
    "apply_rope",
    "attend",
    "build_token_reduction",
    "check_batch",
    "decomposed_rel_pos",
    "diff_lambda",
    "diff_lambda_init",
    "differential_attend",
    "expand_mask",
    "get_mlp_layer",
    "get_norm_layer",
    "indexer_loss",
    "key_padding_mask",
    "lambda_parameters",
    "merge_heads",
    "naflex_grids",
    "naflex_rope_table",
    "parse_token_reduction",
    "patch_embedding",
    "patchify",
    "pool_tokens",
    "rel_pos_layers",
    "resample_abs_pos_embed",
    "rope_table",
    "rotary_embedding",
    "sdpa_mask",
    "set_indexer_stage",
    "sincos_1d",
    "sincos_2d",
    "split_heads",
    "to_2tuple",
    "topk_warmup",
    "window_partition",
    "window_unpartition",
]
