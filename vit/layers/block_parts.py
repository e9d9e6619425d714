"""The optional parts of a Transformer block beyond ViT's, chosen by one frozen options object, with timm's names.

    qkv_fused=False   q, k, v saved as three Linears `q_proj`, `k_proj`, `v_proj` (EVA02 base / large / CLIP); they
                      are still computed as one fused `qkv` matmul, split and joined by state-dict hooks here
    scale_attn_norm   a norm on the heads' concatenated output before `attn.proj` (`attn.norm`; NormFormer, Shleifer
                      et al., 2021; EVA02 CLIP's `scale_attn_inner`, BEiT-3)
    scale_mlp_norm    a norm on the MLP's hidden layer before `fc2` (`mlp.norm`; EVA02's `scale_mlp`, BEiT-3)
    proj_bias         biases of `attn.proj` and of the MLP's linears (AIMv2 has none)
    embed_norm        a norm on the patch tokens inside the patch embedding (`patch_embed.norm`, AIMv2)
    res_post_norm     x + Norm(f(x)): each sub-layer's norm on its output, inside the residual (Swin v2, Liu et al.,
                      2022; timm's ResPostBlock, EVA02-enormous's use_post_norm)
    attn_only_layer_scale  LayerScale on the attention branch only (timm's Eva keyword; Sapiens2)

The q / v-only bias with a fixed zero k bias (Eva, BEiT, DINOv3 `_qkvb`: `q_bias`, `v_bias`) is the attention's
`qkv_bias="qv"`, next to its `qkv_bias=True / False`. Field names are timm's keywords.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

__all__ = ["BlockParts", "join_qkv", "split_qkv_names"]


@dataclass(frozen=True)
class BlockParts:
    """Which optional norms, biases and saved names a model's blocks have (timm's keyword names), validated once."""

    qkv_fused: bool = True  # False: q / k / v saved as q_proj / k_proj / v_proj (computed fused either way)
    scale_attn_norm: bool = False  # attn.norm on the attention output before attn.proj
    scale_mlp_norm: bool = False  # mlp.norm on the MLP's hidden layer before fc2
    proj_bias: bool = True  # biases of attn.proj, mlp.fc1 / fc2 (and SwiGLU's fc1_g / fc1_x)
    embed_norm: bool = False  # patch_embed.norm after the patch projection
    res_post_norm: bool = False  # norm1 / norm2 on the attention's / MLP's output, inside the residual
    attn_only_layer_scale: bool = False  # LayerScale (init_values) on the attention branch only (Sapiens2)

    def __post_init__(self) -> None:
        for f in fields(self):
            if not isinstance(getattr(self, f.name), bool):
                raise TypeError(f"{f.name} must be true or false, got {getattr(self, f.name)!r}.")


_NAMES = ("q_proj", "k_proj", "v_proj")


def split_qkv_names(module, state: dict, prefix: str, local_metadata) -> dict:
    """state_dict hook: the fused `qkv.weight` (3D, D) saved as `q_proj.weight`, `k_proj.weight`, `v_proj.weight` (D, D)
    each (k and v fewer rows with grouped-query attention, the module's `qkv_split`), and the biases as
    `q_proj.bias`, (`k_proj.bias`,) `v_proj.bias`: timm's Eva names with qkv_fused=False. Copies, so no two saved
    tensors share memory (safetensors refuses that)."""
    rows = getattr(module, "qkv_split", None)  # q, k, v rows: fewer k / v ones with grouped-query attention
    weight = state.pop(f"{prefix}qkv.weight")
    for name, part in zip(_NAMES, weight.split(rows) if rows else weight.chunk(3)):
        state[f"{prefix}{name}.weight"] = part.clone()
    if f"{prefix}qkv.bias" in state:  # a learned k bias (timm's AttentionRope)
        bias = state.pop(f"{prefix}qkv.bias")
        for name, part in zip(_NAMES, bias.split(rows) if rows else bias.chunk(3)):
            state[f"{prefix}{name}.bias"] = part.clone()
    for name in ("q", "v"):  # q_bias / v_bias with the k bias fixed at zero (Eva)
        if f"{prefix}{name}_bias" in state:
            state[f"{prefix}{name}_proj.bias"] = state.pop(f"{prefix}{name}_bias")
    return state


def join_qkv(state: dict, prefix: str, *args) -> None:
    """load_state_dict pre-hook, the inverse of `split_qkv_names`: q_proj / k_proj / v_proj read into the fused
    `qkv` (and `q_bias` / `v_bias`, or `qkv.bias`). Parts missing or misshapen are left for load_state_dict's
    own missing-key and shape messages."""
    weights = [state.get(f"{prefix}{name}.weight") for name in _NAMES]
    if any(w is None for w in weights) or len({tuple(w.shape[1:]) for w in weights}) != 1:
        return
    state[f"{prefix}qkv.weight"] = torch.cat(weights)
    for name in _NAMES:
        state.pop(f"{prefix}{name}.weight")
    biases = [state.get(f"{prefix}{name}.bias") for name in _NAMES]
    if all(b is not None for b in biases):
        state[f"{prefix}qkv.bias"] = torch.cat([state.pop(f"{prefix}{name}.bias") for name in _NAMES])
    for name in ("q", "v"):
        if f"{prefix}{name}_proj.bias" in state:
            state[f"{prefix}{name}_bias"] = state.pop(f"{prefix}{name}_proj.bias")
