"""Contrastive losses for two towers, with every process's captions as negatives.

CLIP (Radford et al., 2021, eq. in Fig. 3): symmetric InfoNCE over the (N, N) scaled similarities,
    L = (CE(s * I @ T.T, diag) + CE(s * T @ I.T, diag)) / 2,          I, T: (N, E) normalised features
SigLIP (Zhai et al., 2023, eq. 1): every pair an independent binary decision,
    L = -1/N * sum_ij log sigmoid(z_ij * (s * I_i . T_j + b)),          z_ij = 1 if i == j else -1

Across P processes each holding n = N / P pairs, the features are all-gathered with gradients
(`torch.distributed.nn.functional.all_gather`, as open_clip's ClipLoss with gather_with_grad=True): each process
scores its n images (and captions) against all N, so its loss is the whole batch's share for its rows, and the
mean over processes (DDP's gradient averaging) is the single-process loss over N pairs with the same gradients.
SigLIP's per-process loss is open_clip's SigLipLoss's (its chunks exchanged between neighbours sum to the same
total; an all-gather holds all N captions at once, a ring exchange only two chunks). Every process must hold the
same number of pairs (drop the last uneven batch).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = ["clip_loss", "gather_features", "siglip_loss"]


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather_features(x: torch.Tensor) -> torch.Tensor:
    """(n, E) on each of P processes -> (P * n, E), process order; gradients flow back to each process's rows
    (the backward sums every process's gradient for them)."""
    if _world()[1] == 1:
        return x
    import warnings

    from torch.distributed.nn.functional import all_gather

    with warnings.catch_warnings():  # deprecated for a functional-collectives form that has no gloo backward yet
        warnings.simplefilter("ignore", FutureWarning)
        return torch.cat(all_gather(x), dim=0)


def clip_loss(image: torch.Tensor, text: torch.Tensor, logit_scale: torch.Tensor) -> torch.Tensor:
    """CLIP's symmetric cross-entropy. image, text: (n, E) normalised features of matching pairs on this process;
    logit_scale: the scale itself (exp of the stored parameter, as the model's forward returns it)."""
    rank, world = _world()
    all_image, all_text = gather_features(image), gather_features(text)  # (N, E)
    labels = torch.arange(image.shape[0], device=image.device) + rank * image.shape[0]  # own rows' columns
    per_image = logit_scale * image @ all_text.T  # (n, N)
    per_text = logit_scale * text @ all_image.T  # (n, N)
    return (F.cross_entropy(per_image, labels) + F.cross_entropy(per_text, labels)) / 2


def siglip_loss(image: torch.Tensor, text: torch.Tensor, logit_scale: torch.Tensor,
                logit_bias: torch.Tensor) -> torch.Tensor:
    """SigLIP's sigmoid loss over this process's n images against all N captions, divided by n (open_clip's
    SigLipLoss). logit_scale: the scale itself; logit_bias: the learned bias b."""
    rank, _ = _world()
    all_text = gather_features(text)  # (N, E)
    logits = logit_scale * image @ all_text.T + logit_bias  # (n, N)
    n = image.shape[0]
    signs = -torch.ones_like(logits)
    signs[torch.arange(n), torch.arange(n) + rank * n] = 1.0  # the matching caption of each own image
    return -F.logsigmoid(signs * logits).sum() / n
