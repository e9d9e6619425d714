"""Contrastive losses for two towers, with every process's captions as negatives.

CLIP (Radford et al., 2021, eq. in Fig. 3): symmetric InfoNCE over the (N, N) scaled similarities,
    L = (CE(s * I @ T.T, diag) + CE(s * T @ I.T, diag)) / 2,          I, T: (N, E) normalised features
SigLIP (Zhai et al., 2023, eq. 1): every pair an independent binary decision,
    L = -1/N * sum_ij log sigmoid(z_ij * (s * I_i . T_j + b)),          z_ij = 1 if i == j else -1

Across P processes each holding n = N / P pairs, the features are all-gathered with gradients
(`torch.distributed.nn.functional.all_gather`, as open_clip's ClipLoss with gather_with_grad=True): each process
scores its n images (and captions) against all N, so its loss is the whole batch's share for its rows, and the
mean over processes (DDP's gradient averaging) is the single-process loss over N pairs with the same gradients.
SigLIP's per-process loss is open_clip's SigLipLoss's. Its terms are a sum over caption chunks, so instead of
gathering all N captions at once (`exchange="gather"`) the chunks can travel around the ring of processes
(`exchange="ring"`, SigLIP's chunked exchange): each round every process sends the chunk it holds to both
neighbours and receives theirs (point-to-point, with gradients: the backward sends each received chunk's gradient
back to its sender), so a process holds at most three chunks of n captions, never N. P - 1 chunks arrive in
(P - 1) // 2 two-way rounds plus one one-way round when P - 1 is odd. Every process must hold the same number of
pairs (drop the last uneven batch).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = ["EXCHANGES", "clip_loss", "gather_features", "siglip_loss"]

EXCHANGES = ("gather", "ring")  # how SigLIP's negatives reach a process (module docstring)


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


def clip_loss(image: torch.Tensor, text: torch.Tensor, logit_scale: torch.Tensor, local: bool = False) -> torch.Tensor:
    """CLIP's symmetric cross-entropy. image, text: (n, E) normalised features of matching pairs on this process;
    logit_scale: the scale itself (exp of the stored parameter, as the model's forward returns it); local: these
    pairs only, whatever the processes (features already gathered, e.g. for evaluation)."""
    rank = 0 if local else _world()[0]
    all_image, all_text = (image, text) if local else (gather_features(image), gather_features(text))  # (N, E)
    labels = torch.arange(image.shape[0], device=image.device) + rank * image.shape[0]  # own rows' columns
    per_image = logit_scale * image @ all_text.T  # (n, N)
    per_text = logit_scale * text @ all_image.T  # (n, N)
    return (F.cross_entropy(per_image, labels) + F.cross_entropy(per_text, labels)) / 2


class _Exchange(torch.autograd.Function):
    """Send tensors[i] to send_to[i] and receive one tensor shaped like tensors[0] from each of recv_from, in one
    batch of point-to-point operations; the backward is the same exchange reversed (each received tensor's
    gradient goes back to its sender, each sent tensor's gradient comes back from its receiver)."""

    @staticmethod
    def forward(ctx, send_to: tuple, recv_from: tuple, *tensors: torch.Tensor):
        ctx.send_to, ctx.recv_from = send_to, recv_from
        return _point_to_point(send_to, recv_from, tensors)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        back = _point_to_point(ctx.recv_from, ctx.send_to, [g.contiguous() for g in grads])
        return (None, None, *back)


def _tag(src: int, dst: int) -> int:
    """The tag of a message from rank src to rank dst: one per ordered pair, so no two operations pending between
    the same two processes share one (with two processes the one-way round sends to and receives from the same
    peer at once; gloo matches messages by peer and tag alone)."""
    return 1 + src * _world()[1] + dst


def _point_to_point(send_to, recv_from, tensors) -> tuple[torch.Tensor, ...]:
    me = _world()[0]
    received = tuple(torch.empty_like(tensors[0]) for _ in recv_from)
    ops = [dist.P2POp(dist.isend, t.contiguous(), peer, tag=_tag(me, peer)) for t, peer in zip(tensors, send_to)]
    ops += [dist.P2POp(dist.irecv, r, peer, tag=_tag(peer, me)) for r, peer in zip(received, recv_from)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return received


def _sigmoid_terms(image: torch.Tensor, text: torch.Tensor, logit_scale: torch.Tensor, logit_bias: torch.Tensor,
                   positives: int | None) -> torch.Tensor:
    """sum_ij -log sigmoid(z_ij * logit_ij) over image (n, E) x text (m, E); z_ij = 1 only where j == i + positives
    (the matching captions' columns), -1 everywhere when positives is None."""
    logits = logit_scale * image @ text.T + logit_bias  # (n, m)
    signs = -torch.ones_like(logits)
    if positives is not None:
        n = image.shape[0]
        signs[torch.arange(n), torch.arange(n) + positives] = 1.0
    return -F.logsigmoid(signs * logits).sum()


def siglip_loss(image: torch.Tensor, text: torch.Tensor, logit_scale: torch.Tensor,
                logit_bias: torch.Tensor, exchange: str = "gather", local: bool = False) -> torch.Tensor:
    """SigLIP's sigmoid loss over this process's n images against all N captions, divided by n (open_clip's
    SigLipLoss). logit_scale: the scale itself; logit_bias: the learned bias b; exchange: 'gather' (all captions
    at once) or 'ring' (chunks passed between neighbours; same loss and gradients, see the module docstring);
    local: these pairs only, whatever the processes."""
    if exchange not in EXCHANGES:
        raise ValueError(f"unknown exchange {exchange!r}; use 'gather' or 'ring'.")
    rank, world = (0, 1) if local else _world()
    n = image.shape[0]
    if exchange == "gather" or world == 1:
        return _sigmoid_terms(image, gather_features(text), logit_scale, logit_bias, rank * n) / n
    total = _sigmoid_terms(image, text, logit_scale, logit_bias, 0)  # own captions: the positives are here
    left, right = (rank - 1) % world, (rank + 1) % world
    to_left = to_right = text
    two_way, one_way = divmod(world - 1, 2)
    for _ in range(two_way):  # chunks travel both ways: after round r, those of the processes r steps away
        from_right, from_left = _Exchange.apply((left, right), (right, left), to_left, to_right)
        total = total + _sigmoid_terms(image, from_right, logit_scale, logit_bias, None)
        total = total + _sigmoid_terms(image, from_left, logit_scale, logit_bias, None)
        to_left, to_right = from_right, from_left
    if one_way:  # the chunk of the process opposite on the ring (P - 1 odd): one more step rightwards
        (from_left,) = _Exchange.apply((right,), (left,), to_right)
        total = total + _sigmoid_terms(image, from_left, logit_scale, logit_bias, None)
    return total / n
