"""Knowledge distillation (Hinton et al., 2015, "Distilling the Knowledge in a Neural Network"; DeiT: Touvron et al.,
2021, section 5), the losses as timm 1.0.31's `timm.task` distillation tasks compute them:

    logit    kd = KL(softmax(t / T) || softmax(s / T)) * T^2, averaged over the batch (T^2 keeps the gradient's scale)
    feature  kd = mean((P(f_s) - f_t)^2) (mse) or mean(1 - cos(P(f_s), f_t)) (cosine); f the pooled pre-logits
             vector (B, D) or the patch tokens (B, N, D); P a learned Linear(D_s, D_t), none when the widths match
    token    DeiT's [DIST] head against the teacher: soft (the logit kd) or hard (cross-entropy with argmax t);
             the [CLS] head takes the task loss, and the saved student averages the two heads at inference
    loss     task_weight * task_loss + distill_weight * kd   (the weights' three modes: vit/config/distill_checks.py)

The teacher (vit/train/teacher.py) scores the batch in its own preprocessing. Multi-label (sigmoid) targets: the task
loss is the criterion the caller gives (BCE for multi-hot targets); logit and token kd are softmax over one class
set in timm and here, so they are refused for multi-label runs (vit/config/distill_checks.py), and feature kd, which
never reads the targets, takes them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..config.distill_checks import check_distill_settings, distill_weights
from .teacher import Teacher

__all__ = ["kl_distillation", "hard_distillation", "feature_distillation", "Distiller"]


def kl_distillation(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(softmax(t / T) || softmax(s / T)) * T^2, summed over classes, averaged over the batch: (B, C) x 2 -> ()."""
    log_s = F.log_softmax(student_logits / temperature, dim=-1)
    log_t = F.log_softmax(teacher_logits / temperature, dim=-1)
    return F.kl_div(log_s, log_t, reduction="batchmean", log_target=True) * temperature**2


def hard_distillation(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the student against the teacher's top class (DeiT's hard distillation): (B, C) x 2 -> ()."""
    return F.cross_entropy(student_logits, teacher_logits.argmax(dim=-1))


def feature_distillation(student: torch.Tensor, teacher: torch.Tensor, loss: str = "mse") -> torch.Tensor:
    """(..., D) student features (projected to the teacher's width) against the teacher's (..., D) -> (): the mean
    squared error over every element (timm's), or 1 - cosine similarity averaged over vectors."""
    if loss == "mse":
        return F.mse_loss(student, teacher)
    return (1 - F.cosine_similarity(student, teacher, dim=-1)).mean()


def _grid_tokens(tokens: torch.Tensor, grid: tuple[int, int], to: tuple[int, int]) -> torch.Tensor:
    """(B, h * w, D) patch tokens on a `grid` -> (B, h' * w', D) on the grid `to`, bilinearly, as position tables
    are resampled; the same tensor when the grids match."""
    if tuple(grid) == tuple(to):
        return tokens
    B, _, D = tokens.shape
    maps = tokens.transpose(1, 2).reshape(B, D, *grid)  # (B, D, h, w)
    maps = F.interpolate(maps, size=tuple(to), mode="bilinear", align_corners=False, antialias=True)
    return maps.flatten(2).transpose(1, 2)  # (B, h' * w', D)


class _FeatureTap:
    """Hooks that catch the student's features inside its own forward, so that the model (or the wrapper
    DistributedDataParallel made of it) is called once and syncs every gradient: pooled, the input of `head`
    (forward_head's pre-logits; a distilled model's two heads averaged as its pre-logits are); patch, the output of
    `norm` (forward_features', prefix tokens dropped)."""

    def __init__(self, student: nn.Module, features: str) -> None:
        self.student, self.features, self.caught, self.handles = student, features, [], []

    def __enter__(self) -> _FeatureTap:
        catch = self.caught.append
        if self.features == "patch":
            self.handles.append(self.student.norm.register_forward_hook(lambda m, a, out: catch(out)))
        else:
            for head in filter(None, (self.student.head, getattr(self.student, "head_dist", None))):
                self.handles.append(head.register_forward_pre_hook(lambda m, a: catch(a[0])))
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()

    def result(self) -> torch.Tensor:
        """(B, D_s) pooled or (B, N, D_s) patch features of the forward just run."""
        if self.features == "patch":
            return self.caught[-1][:, self.student.num_prefix_tokens:]
        return sum(self.caught) / len(self.caught)


class Distiller:
    """One kind of distillation between a `student` and a frozen `teacher`. Calling the distiller with the student
    (or the wrapper Accelerate made of it), a batch and its targets gives {'loss', 'output' (the student's logits),
    'task_loss', 'kd_loss'}. Feature distillation trains `projection` too (Linear(D_s, D_t), or None when the widths
    match): the distillation's own part, passed to the call (or its wrapper), saved apart from the student.

    `criterion(logits, target)` is the task loss. The settings are the `distill:` section's fields, by their names;
    each bad one is one sentence (ConfigError / ValueError) here, before any step."""

    def __init__(self, student: nn.Module, teacher: Teacher, criterion: Callable, kind: str = "logit",
                 temperature: float = 1.0, task_weight: float | None = None, distill_weight: float | None = None,
                 token_mode: str = "soft", feature_loss: str = "mse", features: str = "pooled") -> None:
        check_distill_settings(kind, temperature, task_weight, distill_weight, token_mode, feature_loss, features)
        self.kind, self.temperature, self.criterion = kind, float(temperature), criterion
        self.token_mode, self.feature_loss, self.features = token_mode, feature_loss, features
        self.task_weight, self.distill_weight = distill_weights(task_weight, distill_weight)
        self.student, self.teacher, self.projection = student, teacher, None
        ours, theirs = getattr(student, "num_classes", None), teacher.num_classes
        if kind != "feature" and ours != theirs:
            raise ValueError(f"{kind} distillation compares class scores, and the teacher {teacher.name} has "
                             f"{theirs} outputs where the student has {ours} classes; give a teacher trained on the "
                             "student's classes (a CLIP or SigLIP image tower's outputs are its embedding, not "
                             "classes), or use distill.kind=feature, which matches features and takes any class set.")
        if kind == "token":
            if getattr(student, "head_dist", None) is None:
                raise ValueError("token distillation trains DeiT's distillation token, and the student has none; "
                                 "build a distilled student (e.g. deit_tiny_distilled_patch16_224, or "
                                 "model.dist_token=true) or use distill.kind=logit.")
            student.set_distilled_training(True)  # training returns (logits, distillation logits)
        if kind == "feature":
            d_s, d_t = student.num_features, teacher.num_features
            self.grids = None
            if features == "patch":
                self.grids = (tuple(teacher.grid_size), tuple(student.patch_embed.grid_size))
                student.prune_last_block = False  # every patch token leaves the last block
            self.projection = nn.Linear(d_s, d_t) if d_s != d_t else None  # timm: a projection only if needed

    def __call__(self, module: nn.Module, images: torch.Tensor, target: torch.Tensor,
                 projection: nn.Module | None = None) -> dict[str, torch.Tensor]:
        """`module`: the student, or its wrapper; `projection`: `self.projection` or its wrapper (default: it);
        images (B, C, H, W) normalised for the student; target as the criterion takes it."""
        if self.kind == "feature":
            with _FeatureTap(self.student, self.features) as tap:
                logits = module(images)
            project = projection if projection is not None else self.projection
            f_s = tap.result() if project is None else project(tap.result())  # (B, D_t) or (B, N, D_t)
            f_t = self.teacher.features(images, patch=self.features == "patch")
            if self.grids is not None:
                f_t = _grid_tokens(f_t, *self.grids)  # the teacher's patch grid on the student's
            kd = feature_distillation(f_s, f_t, self.feature_loss)
        else:
            # token: the [CLS] and [DIST] heads while training; their mean (one tensor) in eval mode
            out = module(images)
            logits, s = out if isinstance(out, tuple) else (out, out)
            t = self.teacher.logits(images)
            hard = self.kind == "token" and self.token_mode == "hard"
            kd = hard_distillation(s, t) if hard else kl_distillation(s, t, self.temperature)
        task = self.criterion(logits, target)
        loss = self.task_weight * task + self.distill_weight * kd
        return {"loss": loss, "output": logits, "task_loss": task, "kd_loss": kd}
