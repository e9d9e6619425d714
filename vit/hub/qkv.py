"""Separate query, key and value projections (transformers, open_clip's text tower) fused into timm's one `qkv`
Linear: the three parts checked whole and shaped alike, then stacked as (3D, D) weights or (3D,) biases."""

from __future__ import annotations

import torch

__all__ = ["fuse_qkv"]


def fuse_qkv(parts: dict[str, list[torch.Tensor | None]], path: object) -> dict[str, torch.Tensor]:
    """{'blocks.0.attn.qkv.weight': [q, k, v], ...} -> {'blocks.0.attn.qkv.weight': cat([q, k, v]), ...}. A
    missing part or parts of other shapes raise ValueError in one sentence naming `path`; dtypes and finiteness
    are the caller's to check first (torch.cat would cast a bool or int8 part in silence)."""
    out = {}
    for key, qkv in parts.items():
        if any(p is None for p in qkv):
            missing = [n for n, p in zip(("query", "key", "value"), qkv) if p is None]
            raise ValueError(f"the checkpoint has {key.replace('.qkv.', ' ')} without its {' and '.join(missing)} "
                             "projection; it is incomplete or from another architecture.")
        shapes = [tuple(p.shape) for p in qkv]
        if len(set(shapes)) > 1 or len(shapes[0]) != (2 if key.endswith("weight") else 1):
            raise ValueError(f"{path} does not fit this model (shape mismatch: {key.replace('.qkv.', ' ')} "
                             f"query, key, value {', '.join(map(str, shapes))}, which must be one (D, D) matrix or "
                             "(D,) vector each); it is from another architecture: create the model it was saved from.")
        out[key] = torch.cat(qkv, dim=0)  # (3D, D) or (3D,)
    return out
