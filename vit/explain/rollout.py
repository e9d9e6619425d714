"""Where a ViT looks: attention rollout, gradient rollout and raw attention, as pure functions on tensors.

Attention rollout (Abnar & Zuidema, 2020, "Quantifying Attention Flow in Transformers"): each layer's heads
are fused, the residual connection is modelled by mixing with the identity, rows are re-normalized so each
layer stays row-stochastic, and layers are multiplied with later layers on the left:
    A_l' = rownorm(alpha * fuse(A_l) + (1 - alpha) * I),     R = A_L' ... A_{s+1}' A_s'
Gradient rollout (Chefer, Gur & Wolf, ICCV 2021, "Generic Attention-model Explainability"), class-specific:
    R = I;  for each layer l:  R <- R + mean_h[(dy_c/dA_l * A_l)^+] R
Both return (B, N, N) over all tokens; `to_grid` reads out the patch grid: the [CLS] row without the prefix
columns, or for mean-pooled models the mean of the patch rows. The grid shape comes from the model and input,
never from sqrt(N), and any number of prefix tokens is allowed. For a NaFlex batch (vit.layers.naflex: images at
their own aspect ratio, padded to one length) `naflex_to_grids` gives each image its own (h_i, w_i) map, from its
patches' coordinates, padding left out, to be drawn back onto the original non-square image.
Deliberate differences from the widely copied vit-explain script: rows are normalized along the last axis (it
divides by the wrong one), batches work, gradients are paired with their own layer, and no hooks are used.
"""

from __future__ import annotations

from typing import Literal

import torch

from ..layers import naflex_grids

__all__ = ["fuse_heads", "attention_rollout", "gradient_rollout", "raw_attention", "to_grid", "naflex_to_grids",
           "attention_maps"]

HeadFusion = Literal["mean", "max", "min"]


def fuse_heads(attn: torch.Tensor, head_fusion: HeadFusion = "mean") -> torch.Tensor:
    """(B, H, N, N) -> (B, N, N)."""
    if head_fusion == "mean":
        return attn.mean(dim=1)
    if head_fusion == "max":
        return attn.amax(dim=1)
    if head_fusion == "min":
        return attn.amin(dim=1)
    raise ValueError(f"unknown head_fusion {head_fusion!r}; choose 'mean', 'max' or 'min'.")


def _discard_lowest(a: torch.Tensor, ratio: float, num_prefix_tokens: int) -> torch.Tensor:
    """Zero the lowest `ratio` of each sample's patch-to-patch entries; rows and columns of prefix tokens
    ([CLS]) are never discarded."""
    B, N, _ = a.shape
    p = num_prefix_tokens
    patch = a[:, p:, p:].reshape(B, -1)  # (B, (N-p)^2)
    k = int(patch.shape[1] * ratio)
    if k == 0:
        return a
    idx = patch.topk(k, dim=1, largest=False).indices
    patch = patch.scatter(1, idx, 0.0).reshape(B, N - p, N - p)
    out = a.clone()
    out[:, p:, p:] = patch
    return out


def attention_rollout(
    attentions: list[torch.Tensor],
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    residual_alpha: float = 0.5,
    start_layer: int = 0,
    num_prefix_tokens: int = 1,
) -> torch.Tensor:
    """Attention rollout over layers `start_layer..L-1`. attentions: one (B, H, N, N) map per layer.
    Returns (B, N, N); every row sums to 1."""
    if not attentions:
        raise ValueError("attention_rollout needs at least one attention map.")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}.")
    B, _, N, _ = attentions[0].shape
    eye = torch.eye(N, dtype=attentions[0].dtype, device=attentions[0].device)
    result = eye.expand(B, N, N)
    for attn in attentions[start_layer:]:
        a = fuse_heads(attn, head_fusion)
        if discard_ratio:
            a = _discard_lowest(a, discard_ratio, num_prefix_tokens)
        a = residual_alpha * a + (1.0 - residual_alpha) * eye
        a = a / a.sum(dim=-1, keepdim=True)  # rows sum to 1 again
        result = a @ result  # later layers on the left
    return result


def gradient_rollout(
    attentions: list[torch.Tensor], gradients: list[torch.Tensor], start_layer: int = 0
) -> torch.Tensor:
    """Chefer et al.'s rule: R <- R + mean_h[(grad * attn)^+] R, layer by layer with each layer's own gradient."""
    if len(attentions) != len(gradients):
        raise ValueError(f"{len(attentions)} attention maps but {len(gradients)} gradients.")
    B, _, N, _ = attentions[0].shape
    result = torch.eye(N, dtype=attentions[0].dtype, device=attentions[0].device).expand(B, N, N)
    for attn, grad in list(zip(attentions, gradients))[start_layer:]:
        cam = (grad * attn).clamp(min=0).mean(dim=1)  # (B, N, N)
        result = result + cam @ result
    return result


def raw_attention(attentions: list[torch.Tensor], layer: int = -1, head_fusion: HeadFusion = "mean") -> torch.Tensor:
    """One layer's head-fused attention (B, N, N), for comparison."""
    return fuse_heads(attentions[layer], head_fusion)


def to_grid(
    relevance: torch.Tensor, grid: tuple[int, int], num_prefix_tokens: int = 1, pool: str = "token"
) -> torch.Tensor:
    """(B, N, N) token relevance -> (B, h, w) patch map: the [CLS] row over patch columns ('token'), or the
    mean of the patch rows ('avg', for mean-pooled models)."""
    p = num_prefix_tokens
    h, w = grid
    if relevance.shape[-1] != p + h * w:
        raise ValueError(f"{relevance.shape[-1]} tokens do not match {p} prefix token(s) + a {h}x{w} grid.")
    if pool == "token":
        if p == 0:
            raise ValueError("a model without a [CLS] token has no [CLS] row; use pool='avg'.")
        row = relevance[:, 0, p:]
    else:
        row = relevance[:, p:, p:].mean(dim=1)
    return row.reshape(-1, h, w)


def naflex_to_grids(
    relevance: torch.Tensor, patch_coord: torch.Tensor, patch_valid: torch.Tensor, num_prefix_tokens: int = 1,
    pool: str = "token",
) -> list[torch.Tensor]:
    """(B, prefix + N, prefix + N) relevance of a NaFlex batch -> B maps (h_i, w_i): the [CLS] row over the valid
    patch columns ('token'), or the mean of the valid patch rows; each patch at its (row, column)."""
    p = num_prefix_tokens
    if relevance.shape[-1] != p + patch_valid.shape[1]:
        raise ValueError(f"{relevance.shape[-1]} tokens do not match {p} prefix token(s) + "
                         f"{patch_valid.shape[1]} patches.")
    if pool == "token":
        if p == 0:
            raise ValueError("a model without a [CLS] token has no [CLS] row; use pool='avg'.")
        row = relevance[:, 0, p:]  # (B, N)
    else:
        w = patch_valid.to(relevance.dtype)[..., None]  # (B, N, 1): padding rows left out of the mean
        row = (relevance[:, p:, p:] * w).sum(1) / w.sum(1)
    return [g[0] for g in naflex_grids(row[..., None], patch_coord, patch_valid)]


def attention_maps(
    model,
    x: torch.Tensor | dict[str, torch.Tensor],
    method: str = "rollout",
    target_class: torch.Tensor | None = None,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    layer: int = -1,
    residual_alpha: float = 0.5,
) -> tuple[torch.Tensor | list[torch.Tensor], torch.Tensor]:
    """Run `model` on images x (B, C, H, W) through `model.forward_with_attention` (the explicit attention path)
    and return (grid maps (B, h, w), logits (B, K)). `target_class` (B,) is used by 'grad_rollout' (default: the
    predicted class). A NaFlex batch dict gives a list of B maps (h_i, w_i) instead (`naflex_to_grids`)."""
    p = model.num_prefix_tokens
    pool = getattr(model, "global_pool", "token")
    if isinstance(x, dict):  # NaFlex: one map per image, at its own grid
        def readout(rel: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
            return naflex_to_grids(rel, x["patch_coord"], x["patch_valid"], p, pool)
    else:
        grid = model.grid_size(tuple(x.shape[-2:]))

        def readout(rel: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
            return to_grid(rel, grid, p, pool)
    if method == "grad_rollout":
        with torch.enable_grad():
            logits, attns = model.forward_with_attention(x)
            target = logits.argmax(1) if target_class is None else target_class
            score = logits.gather(1, target[:, None]).sum()  # samples are independent: one backward for all
            grads = torch.autograd.grad(score, attns)
        rel = gradient_rollout([a.detach() for a in attns], [g.detach() for g in grads], start_layer)
        return readout(rel), logits.detach()
    with torch.no_grad():
        logits, attns = model.forward_with_attention(x)
    if method == "rollout":
        rel = attention_rollout(attns, head_fusion, discard_ratio, residual_alpha, start_layer, p)
    elif method == "attention":
        rel = raw_attention(attns, layer, head_fusion)
    else:
        raise ValueError(f"unknown method {method!r}; choose 'rollout', 'grad_rollout' or 'attention'.")
    return readout(rel), logits
