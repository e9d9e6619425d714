"""Which features combine: one table of the pairs that do not, each with the sentence a user reads.

A row is (feature, feature, reason). Every place that could meet a pair (a layer's constructor, a forward that is
handed a mask or a rotary table, a switch such as `set_token_reduction`) calls `check_combination` with the
features it sees, so a refusal is written once, here, and a new feature adds rows instead of `if`s in 4 files.
Feature names:

    sparse_attention  top-k key blocks (vit.layers.sparse_attention)     rel_pos     a relative position bias
    rope              a model with rotary positions                      rope_table  a rotary table given to forward
    token_reduction   ToMe / EViT between blocks (vit.layers.token_reduction)
    attn_mask         an attention mask or is_causal given to forward    tracing     torch.fx / export tracing
    patch_keep        token deletion by patch index (`encode`)           naflex      NaFlex inputs (vit.layers.naflex)
    dynamic_img_size  positions resampled per input size                 dist_token  DeiT's distillation token
    sincos            fixed sine-cosine positions                        res_post_norm / post_norm  norm placements
    diff_attention    differential attention (vit.layers.diff_attention)  parallel_block  timm's ParallelScalingBlock
    windowed_attention  SAM's windows and decomposed relative positions (vit.layers.windowed_attention)
"""

from __future__ import annotations

__all__ = ["CONFLICTS", "FEATURES", "check_combination"]

_KEEP_PATCHES = ("patch_keep removes patches whose rotary positions or relative position bias the model would still "
                 "apply; drop patch_keep for this model.")
_NAFLEX_EMBEDS = ("NaFlex models (timm's NaFlexVit) have no distillation token and resample a learned table per "
                  "image; drop dist_token, use pos_embed='learn' or 'none'.")

_DIFF_POSITIONS = ("differential attention (timm's DiffAttention) takes absolute positions only; drop rope / rel_pos "
                   "or use attn_layer='attn'.")
_WINDOW_POSITIONS = ("windowed attention carries its own decomposed relative positions (use_rel_pos); drop rope / "
                     "rel_pos for this model.")
_PARALLEL_POSITIONS = "a parallel block (timm's) takes absolute positions only; drop rope / rel_pos or the block."



def _each(feature: str, others: tuple[str, ...], reason: str) -> list[tuple[str, str, str]]:
    """Rows refusing `feature` with each of `others` for one reason."""
    return [(feature, other, reason) for other in others]


CONFLICTS: tuple[tuple[str, str, str], ...] = (
    ("sparse_attention", "rel_pos",
     "relative position bias runs on dense attention; drop sparse_attention or rel_pos (on a built model: "
     "set_sparse_attention(None))."),
    ("sparse_attention", "rope_table",
     "rotary positions run on dense attention; drop sparse_attention when passing a rope table."),
    ("token_reduction", "rope",
     "token reduction merges or drops patches whose rotary positions every block still applies by grid place; this "
     "model has rotary positions, so leave token reduction off."),
    ("token_reduction", "rope_table",
     "token reduction cannot run with rotary positions; call set_token_reduction(None)."),
    ("token_reduction", "rel_pos",
     "token reduction changes which tokens exist, which a relative position bias is built for; call "
     "set_token_reduction(None)."),
    ("token_reduction", "tracing",
     "token reduction runs eagerly only (the token count depends on the data); call set_token_reduction(None) "
     "before tracing, scripting or exporting the model."),
    ("token_reduction", "attn_mask",
     "token reduction changes which tokens exist, so it cannot take an attention mask; call "
     "set_token_reduction(None) first."),
    *_each("patch_keep", ("rope", "rel_pos"), _KEEP_PATCHES),
    ("patch_keep", "naflex", "patch_keep indexes one square grid; a NaFlex batch drops patches by patch_valid."),
    ("rel_pos", "dynamic_img_size",
     "a relative position bias is built for one patch grid (as timm's); build the model with dynamic_img_size=False "
     "and change its size with set_input_size."),
    ("naflex", "dist_token", _NAFLEX_EMBEDS),
    ("naflex", "sincos", _NAFLEX_EMBEDS),
    ("res_post_norm", "post_norm",
     "res_post_norm puts the norm inside the residual; it cannot be combined with norm_first=False (a norm after "
     "the residual sum)."),
    ("diff_attention", "sparse_attention",
     "differential attention subtracts two dense softmax maps; sparse attention does not apply to it, so drop "
     "sparse_attention for this model."),
    *_each("diff_attention", ("rel_pos", "rope", "rope_table"), _DIFF_POSITIONS),
    ("diff_attention", "token_reduction",
     "token reduction ranks and merges tokens by one softmax map, which differential attention does not have; "
     "leave token reduction off for this model."),
    ("parallel_block", "sparse_attention",
     "a parallel block (attention beside the MLP, one input projection) attends densely; drop sparse_attention."),
    ("parallel_block", "token_reduction",
     "a parallel block adds attention and MLP from one input, with no step between them to reduce tokens; leave "
     "token reduction off for this model."),
    *_each("parallel_block", ("rel_pos", "rope"), _PARALLEL_POSITIONS),
    ("windowed_attention", "sparse_attention",
     "windowed attention already keeps each query to its window; drop sparse_attention for this model."),
    ("windowed_attention", "token_reduction",
     "windowed attention cuts the patch grid into windows, which merged or dropped tokens no longer fill; leave "
     "token reduction off for this model."),
    ("windowed_attention", "attn_mask",
     "windowed attention masks by window itself and takes no attention mask or is_causal; drop them."),
    *_each("windowed_attention", ("rope", "rope_table", "rel_pos"), _WINDOW_POSITIONS),
    ("windowed_attention", "patch_keep",
     "patch_keep removes patches from the grid that windowed attention cuts into windows; drop patch_keep."),
)

FEATURES = frozenset(name for row in CONFLICTS for name in row[:2])


def check_combination(**features: bool) -> None:
    """Raise ValueError with the table's sentence for the first pair of the features present (True) that does not
    combine. Only the features a caller can see are named: `check_combination(token_reduction=True, rope=...)`."""
    unknown = sorted(set(features) - FEATURES)
    if unknown:  # a misspelled feature would check nothing
        raise TypeError(f"unknown feature(s) {', '.join(unknown)}; the table knows {', '.join(sorted(FEATURES))}.")
    for a, b, reason in CONFLICTS:  # in the table's order: tracing before the mask a traced input looks like
        if features.get(a) and features.get(b):
            raise ValueError(reason)
