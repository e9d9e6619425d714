"""Self-supervised losses and schedules, as DINO (Caron et al. 2021) and DINOv2 (Oquab et al. 2023) train: the
[CLS] self-distillation loss with centering or Sinkhorn-Knopp, iBOT's masked-patch loss (Zhou et al. 2022) and the
KoLeo regulariser (Sablayrolles et al. 2019), plus the teacher's temperature and momentum schedules as pure
functions of the optimizer step (as vit/train/optim.py:lr_at).

DINO, teacher views t (the global crops), student views s (global and local crops), K prototypes:

    P_t = softmax((g_t - c) / tau_t)        P_s = log_softmax(g_s / tau_s)
    L   = sum_{t != s} -<P_t, P_s> / (#pairs * B)                  (a view is never its own target)
    c  <- m c + (1 - m) mean_{views, batch} g_t                    (the centre, after the loss)

Sinkhorn-Knopp (DINOv2's option) replaces softmax((g_t - c) / tau_t) by the doubly-normalised assignment of
exp(g_t / tau_t): rows (prototypes) to 1/K, columns (images) to 1/B, `iterations` times, then x B.
iBOT: the same cross-entropy per masked patch token, each image's masked tokens weighted 1 / (their number), the sum
over the batch / B, with its own centre. KoLeo: -mean_i log(min_{j != i} ||x_i - x_j|| + eps), x L2-normalised.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = ["teacher_temperature", "teacher_momentum", "sinkhorn_knopp", "dino_targets", "DINOLoss",
           "IBOTPatchLoss", "koleo_loss", "feature_spread"]


def teacher_temperature(step: int, warmup_steps: int, start: float, end: float) -> float:
    """DINO's teacher temperature: `np.linspace(start, end, warmup_steps)[step]` during the warm-up, then `end`."""
    if step >= warmup_steps - 1:
        return end
    return start + (end - start) * step / (warmup_steps - 1)


def teacher_momentum(step: int, total_steps: int, base: float, final: float = 1.0) -> float:
    """DINO's EMA momentum: cosine from `base` at step 0 to `final` at `total_steps`."""
    t = min(step, total_steps) / max(1, total_steps)
    return final - (final - base) * (math.cos(math.pi * t) + 1) / 2


def _all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """`x` summed over processes (the centre and Sinkhorn's sums are over the global batch)."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(x)
    return x


def _full(x: torch.Tensor) -> torch.Tensor:
    """Half precision up to float32 (softmax and logs under autocast); float32 and float64 kept."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


@torch.no_grad()
def sinkhorn_knopp(logits: torch.Tensor, temperature: float, iterations: int = 3) -> torch.Tensor:
    """(B, K) logits to (B, K) targets whose rows sum to 1 and whose columns are balanced over the global batch."""
    q = torch.exp(_full(logits) / temperature).t()  # (K, B)
    b = q.shape[1] * _world_size()
    k = q.shape[0]
    q /= _all_reduce_sum(q.sum())
    for _ in range(iterations):
        q /= _all_reduce_sum(q.sum(dim=1, keepdim=True))  # each prototype's mass to 1/K
        q /= k
        q /= q.sum(dim=0, keepdim=True)  # each image's mass to 1/B
        q /= b
    return (q * b).t()


@torch.no_grad()
def dino_targets(logits: torch.Tensor, centre: torch.Tensor | None, temperature: float,
                 centering: str = "centre") -> torch.Tensor:
    """The teacher's target distribution for (N, K) logits: softmax((g - c) / tau) ('centre'), Sinkhorn-Knopp
    ('sinkhorn') or softmax(g / tau) ('none': no guard against collapse; for tests)."""
    if centering == "sinkhorn":
        return sinkhorn_knopp(logits, temperature)
    if centering == "centre":
        logits = logits - centre
    return F.softmax(_full(logits) / temperature, dim=-1)


class _Centred(nn.Module):
    """A loss with an EMA centre of the teacher's logits (a buffer: saved in the task state for an exact resume)."""

    def __init__(self, out_dim: int, student_temp: float, centre_momentum: float, centering: str) -> None:
        super().__init__()
        self.student_temp, self.centre_momentum, self.centering = student_temp, centre_momentum, centering
        self.register_buffer("centre", torch.zeros(1, out_dim))

    @torch.no_grad()
    def update_centre(self, logits: torch.Tensor) -> None:
        """c <- m c + (1 - m) mean(logits), the mean over every process's rows."""
        total = _all_reduce_sum(_full(logits).sum(dim=0, keepdim=True))
        mean = total / (logits.shape[0] * _world_size())
        self.centre.mul_(self.centre_momentum).add_(mean, alpha=1 - self.centre_momentum)


class DINOLoss(_Centred):
    """The [CLS] loss over views (module docstring); `forward(teacher, student, teacher_temp)` takes lists of (B, K)
    logits, the teacher's views first among the student's (view i of both is the same crop), and updates the
    centre after computing the loss (as DINO: the targets use the centre from before this batch)."""

    def forward(self, teacher: list[torch.Tensor], student: list[torch.Tensor], teacher_temp: float) -> torch.Tensor:
        t_all = torch.cat(teacher)  # (T*B, K)
        targets = dino_targets(t_all, self.centre, teacher_temp, self.centering).chunk(len(teacher))
        total, pairs = 0.0, 0
        for s_i, s in enumerate(student):
            log_p = F.log_softmax(_full(s) / self.student_temp, dim=-1)  # (B, K)
            for t_i, t in enumerate(targets):
                if t_i != s_i:
                    total = total - (t * log_p).sum(dim=-1).mean()
                    pairs += 1
        if self.centering == "centre":
            self.update_centre(t_all)
        return total / pairs


class IBOTPatchLoss(_Centred):
    """iBOT's masked-patch loss: `forward(teacher, student, mask, teacher_temp)` with (M, K) logits of the M masked
    tokens (rows in the order of `mask.nonzero()`) and `mask` (B, N) bool; updates its own centre after."""

    def forward(self, teacher: torch.Tensor, student: torch.Tensor, mask: torch.Tensor,
                teacher_temp: float) -> torch.Tensor:
        targets = dino_targets(teacher, self.centre, teacher_temp, self.centering)
        ce = -(targets * F.log_softmax(_full(student) / self.student_temp, dim=-1)).sum(dim=-1)  # (M,)
        per_image = mask.flatten(1).sum(dim=1, keepdim=True).clamp(min=1)  # (B, 1) masked tokens per image
        weight = (1.0 / per_image).expand_as(mask.flatten(1))[mask.flatten(1)]  # (M,)
        if self.centering == "centre":
            self.update_centre(teacher)
        return (ce * weight).sum() / mask.shape[0]


def koleo_loss(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """KoLeo on (B, D) features: -mean log(distance to the nearest other feature + eps), features L2-normalised;
    the distance is PyTorch's pairwise_distance (eps added to the difference), as DINOv2's."""
    x = F.normalize(_full(x), dim=-1, eps=eps)
    with torch.no_grad():
        sim = x @ x.t()
        sim.fill_diagonal_(-2.0)  # never one's own neighbour
        nearest = sim.argmax(dim=1)
    d = F.pairwise_distance(x, x[nearest], eps=eps)
    return -torch.log(d + eps).mean()


@torch.no_grad()
def feature_spread(x: torch.Tensor) -> float:
    """How much (B, D) outputs vary across the batch: the mean over dimensions of their standard deviation, on
    L2-normalised rows (0 when every image gives the same output: collapse)."""
    if x.shape[0] < 2:
        return float("inf")
    return F.normalize(x.float(), dim=-1).std(dim=0).mean().item()
