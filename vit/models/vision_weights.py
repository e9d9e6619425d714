"""The Vision Transformer's own adaptation of pretrained weights (timm's `checkpoint_filter_fn` for its ViT).

Weights trained at another resolution or on another number of input channels still fit a ViT:
  - position embeddings (1, prefix + h*w, D) are resampled to the model's patch grid (bicubic, prefix rows
    kept apart, as timm's `resample_abs_pos_embed`);
  - BEiT's relative position tables ((2h - 1)(2w - 1) + 3, H) are resampled to the model's grid (timm's
    `resize_rel_pos_bias_table`, as timm's BEiT loader);
  - the patch projection (D, C, P, P) is adapted to the model's channels by timm's `adapt_input_conv`
    (summed over RGB for 1 channel, as a grey image is the sum of its colour planes; repeated and rescaled
    for more).
The generic loader (vit/hub/weights.py) calls this through `VisionTransformer.checkpoint_filter_fn` and then
handles what every classifier shares (the head).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..layers import resample_abs_pos_embed

__all__ = ["checkpoint_filter_fn"]


def checkpoint_filter_fn(state: dict[str, torch.Tensor], model: nn.Module, report: Any) -> dict[str, torch.Tensor]:
    """A copy of `state` whose positions and patch projection fit `model`; each change is appended to
    `report.actions` (a vit.hub.weights.LoadReport). Anything that cannot be adapted is left for the loader's
    strict check, except positions that are not a square grid, which raise ValueError here."""
    state = dict(state)
    own = model.state_dict()
    pos = state.get("pos_embed")
    if pos is not None and "pos_embed" in own and pos.shape != own["pos_embed"].shape:
        if pos.ndim != 3:  # (1, prefix + grid, dim); anything else cannot be resampled
            raise ValueError(f"position embeddings of shape {tuple(pos.shape)} cannot be resampled to "
                             f"{tuple(own['pos_embed'].shape)}; the checkpoint is from another architecture.")
        prefix = getattr(model, "num_pos_prefix", getattr(model, "num_prefix_tokens", 1))  # rows of prefix tokens
        new_grid = model.patch_embed.grid_size
        old_n = pos.shape[1] - prefix
        side = math.isqrt(old_n)
        if side * side != old_n or pos.shape[-1] != own["pos_embed"].shape[-1]:
            raise ValueError(
                f"position embeddings of shape {tuple(pos.shape)} cannot be resampled to "
                f"{tuple(own['pos_embed'].shape)}; the checkpoint is from another architecture."
            )
        state["pos_embed"] = resample_abs_pos_embed(pos, new_grid, (side, side), prefix)
        report.actions.append(f"resampled pos_embed from a {side}x{side} grid to {new_grid[0]}x{new_grid[1]}")
    for key in [k for k in state if k.endswith("relative_position_bias_table") and k in own]:
        if state[key].shape != own[key].shape and state[key].ndim == 2 and state[key].shape[1] == own[key].shape[1]:
            from timm.layers import resize_rel_pos_bias_table

            grid = model.patch_embed.grid_size
            state[key] = resize_rel_pos_bias_table(state[key], new_window_size=grid, new_bias_shape=own[key].shape)
            report.actions.append(f"resampled {key} to a {grid[0]}x{grid[1]} grid")
    w, own_w = state.get("patch_embed.proj.weight"), own.get("patch_embed.proj.weight")
    if w is not None and own_w is not None and w.ndim == 4 and w.shape[1] != own_w.shape[1] \
            and (w.shape[0], *w.shape[2:]) == (own_w.shape[0], *own_w.shape[2:]):
        from timm.models import adapt_input_conv

        state["patch_embed.proj.weight"] = adapt_input_conv(own_w.shape[1], w, base_chans=w.shape[1])
        report.actions.append(f"adapted patch_embed.proj from {w.shape[1]} to {own_w.shape[1]} input channels")
    return state
