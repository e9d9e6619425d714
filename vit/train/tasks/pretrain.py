"""Self-supervised pretraining as DINOv2 trains it (pretrain.method: dino; Oquab et al. 2023, Caron et al. 2021):
a student (the run's model, no classifier) with DINO's head learns to match an EMA teacher across crops,

    loss = DINO([CLS] of every crop vs the teacher's on the other global crop)
           + ibot_weight * iBOT(masked patch tokens of the global crops vs the teacher's unmasked ones)
           + koleo_weight * KoLeo(the student's [CLS] of each global crop)

(vit/train/ssl_losses.py). The teacher (backbone + head) is a frozen copy moved after every optimizer step,
theta_t <- m theta_t + (1 - m) theta_s, m cosine from pretrain.momentum to 1; it and the centres are this task's
state, so a resume is exact. Local crops run through the same student at their own size (model.dynamic_img_size:
positions resampled). The head and iBOT's mask token are extra modules (optimised, kept by the training state,
never in the checkpoint); the checkpoint folder is the student backbone alone, a plain model folder timm loads.
A collapsed teacher (its outputs the same for every image) stops the run with a sentence (pretrain.collapse_spread).
Evaluation has no labels: the held-out images' [CLS] spread of the student and the teacher.
"""

from __future__ import annotations

import copy

import torch

from ...layers.dino_head import DINOHead
from ..knn_monitor import KnnMonitor, with_knn
from ..ssl_losses import DINOLoss, IBOTPatchLoss, feature_spread, koleo_loss, teacher_momentum, teacher_temperature
from .base import Evaluation, Task

__all__ = ["DinoTask", "TrainingCollapsed", "random_patch_mask"]


class TrainingCollapsed(FloatingPointError):
    """Self-supervised training that stopped learning anything: every image gives the teacher the same output."""


def random_patch_mask(batch: int, patches: int, ratio: float, generator: torch.Generator | None = None,
                      device=None) -> torch.Tensor:
    """(B, N) bool: round(ratio * N) patches (at least 1) of each image chosen uniformly at random."""
    k = max(1, round(ratio * patches))
    noise = torch.rand(batch, patches, generator=generator, device=device)
    ranks = noise.argsort(dim=1).argsort(dim=1)
    return ranks < k


class MaskToken(torch.nn.Module):
    """iBOT's learned token that replaces a masked patch's embedding in the student."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.token = torch.nn.Parameter(torch.zeros(1, 1, dim))
        torch.nn.init.normal_(self.token, std=0.02)


class DinoTask(Task):
    select_by = "spread"  # no labels: the held-out features' spread ranks the checkpoints (best/)
    bypasses_wrapper = True  # the student runs unwrapped (masked and local crops): the loop syncs its gradients

    def __init__(self, cfg, classes: list[str], model: torch.nn.Module) -> None:
        super().__init__(cfg, classes)
        p = cfg.pretrain
        self.head = DINOHead(model.num_features, p.out_dim, p.hidden_dim, p.bottleneck_dim)
        self.teacher = copy.deepcopy(model).requires_grad_(False).eval()
        self.teacher_head = copy.deepcopy(self.head).requires_grad_(False).eval()
        self.dino = DINOLoss(p.out_dim, p.student_temp, p.centre_momentum, p.centering)
        self.ibot = IBOTPatchLoss(p.out_dim, p.student_temp, p.centre_momentum, p.centering) if p.ibot_weight else None
        self.mask_token = MaskToken(model.num_features) if p.ibot_weight else None
        self._mask: torch.Tensor | None = None  # the student's patch mask during its forward (iBOT)
        if self.mask_token is not None:
            model.patch_embed.register_forward_hook(self._apply_mask)
        self.spread = float("inf")  # the last batch's teacher spread (collapse check)
        self.knn = KnnMonitor(cfg) if p.knn_root else None  # a few labelled images scored at each evaluation

    @classmethod
    def from_config(cls, cfg, classes, train_ds=None, model=None) -> DinoTask:
        if model is None:
            raise ValueError("a DINO task needs the student model it trains (task_for(..., model=)).")
        patch = model.patch_embed.patch_size[0]
        p = cfg.pretrain
        if p.local_crops and p.local_size % patch:
            raise ValueError(f"pretrain.local_size is {p.local_size} pixels, which is not a whole number of the "
                             f"model's {patch}-pixel patches; use a multiple of {patch}.")
        return cls(cfg, classes, model)

    # --- the student's mask (iBOT) ------------------------------------------------------------------------------

    def _apply_mask(self, module, inputs, out: torch.Tensor) -> torch.Tensor:
        """patch_embed's output (B, N, D) with the masked patches replaced by the mask token."""
        if self._mask is None or out.shape[:2] != self._mask.shape:
            return out
        return torch.where(self._mask[..., None], self.mask_token.token.to(out.dtype), out)

    # --- training ---------------------------------------------------------------------------------------------

    def _temperature(self, run) -> float:
        p = self.cfg.pretrain
        warmup = int(p.warmup_teacher_temp_epochs * run.steps_per_epoch)
        return teacher_temperature(run.state.step, warmup, p.warmup_teacher_temp, p.teacher_temp)

    @staticmethod
    def _encode(model, head, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(pooled head logits (B, K), patch tokens (B, N, D), pooled features (B, D)) of images x."""
        tokens = model.forward_features(x)  # (B, prefix + N, D)
        pooled = model.forward_head(tokens, pre_logits=True)  # (B, D)
        return head(pooled), tokens[:, model.num_prefix_tokens:], pooled

    def loss(self, run, x, y) -> torch.Tensor:
        if not isinstance(x, (list, tuple)):
            raise TypeError("a DINO task reads multi-crop batches (vit/data/pretrain.py): a list of crop tensors.")
        if next(self.teacher.parameters()).device != x[0].device:  # once: the teacher follows the accelerator
            self.teacher.to(x[0].device), self.teacher_head.to(x[0].device), self.dino.to(x[0].device)
            if self.ibot is not None:
                self.ibot.to(x[0].device)
        student = run.accelerator.unwrap_model(run.model)
        head = run.extras["head"]
        globals_ = torch.cat(x[:2])  # (2B, C, H, W)
        temp = self._temperature(run)
        with run.accelerator.autocast():
            with torch.no_grad():
                t_logits, t_patches, _ = self._encode(self.teacher, self.teacher_head, globals_)
            mask = None
            if self.ibot is not None:
                mask = random_patch_mask(t_patches.shape[0], t_patches.shape[1], self.cfg.pretrain.mask_ratio,
                                         device=globals_.device)
            self._mask = mask
            s_logits, s_patches, s_pooled = self._encode(student, head, globals_)
            self._mask = None
            student_views = list(s_logits.chunk(2))
            if len(x) > 2:  # the local crops, at their own size, in one pass
                student_views += list(self._encode(student, head, torch.cat(x[2:]))[0].chunk(len(x) - 2))
        self.spread = feature_spread(t_logits)
        loss = self.dino(list(t_logits.chunk(2)), student_views, temp)
        p = self.cfg.pretrain
        if self.ibot is not None:
            with torch.no_grad():
                t_masked = self.teacher_head(t_patches[mask])  # (M, K)
            loss = loss + p.ibot_weight * self.ibot(t_masked, head(s_patches[mask]), mask, temp)
        if p.koleo_weight:
            loss = loss + p.koleo_weight * sum(koleo_loss(v) for v in s_pooled.chunk(2))
        return loss

    def extra_modules(self) -> dict[str, torch.nn.Module]:
        return {"head": self.head, **({"mask_token": self.mask_token} if self.mask_token is not None else {})}

    @torch.no_grad()
    def after_step(self, run) -> None:
        """The teacher's EMA step, then the collapse check (every process sees the same mean spread)."""
        m = teacher_momentum(run.state.step, run.total_steps, self.cfg.pretrain.momentum)
        acc = run.accelerator
        for teacher, student in ((self.teacher, acc.unwrap_model(run.model)),
                                 (self.teacher_head, acc.unwrap_model(run.extras["head"]))):
            for pt, ps in zip(teacher.parameters(), student.parameters()):
                pt.mul_(m).add_(ps.detach().to(pt.dtype), alpha=1 - m)
        limit = self.cfg.pretrain.collapse_spread
        if limit and acc.reduce(torch.tensor(self.spread, device=acc.device), "mean").item() < limit:
            raise TrainingCollapsed(
                f"the teacher's outputs collapsed at step {run.state.step}: every image gives it the same output "
                f"(spread {self.spread:.2e} < pretrain.collapse_spread {limit:g}), so the backbone learns nothing "
                "more; keep pretrain.centering=centre or sinkhorn, raise pretrain.teacher_temp or lower optim.lr.")

    def task_state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        tensors = {f"teacher.{k}": v for k, v in self.teacher.state_dict().items()}
        tensors |= {f"teacher_head.{k}": v for k, v in self.teacher_head.state_dict().items()}
        tensors["dino_centre"] = self.dino.centre
        if self.ibot is not None:
            tensors["ibot_centre"] = self.ibot.centre
        return {"method": "dino"}, {k: v.detach().cpu().contiguous() for k, v in tensors.items()}

    def load_task_state(self, values: dict, tensors: dict[str, torch.Tensor]) -> None:
        for prefix, module in (("teacher.", self.teacher), ("teacher_head.", self.teacher_head)):
            module.load_state_dict({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})
        self.dino.centre.copy_(tensors["dino_centre"])
        if self.ibot is not None:
            self.ibot.centre.copy_(tensors["ibot_centre"])

    # --- evaluation and checkpoints: the backbone alone -------------------------------------------------------

    @torch.no_grad()
    def evaluate(self, run, model: torch.nn.Module) -> Evaluation:
        """The spread of the held-out images' pooled features, student and teacher (no labels to score)."""
        model.eval()
        feats: dict[str, list] = {"student": [], "teacher": []}
        for x, _ in run.val_loader:
            with run.accelerator.autocast():
                feats["student"].append(run.accelerator.gather_for_metrics(model(x).float()))
                self.teacher.to(x.device)
                feats["teacher"].append(run.accelerator.gather_for_metrics(self.teacher(x).float()))
        s, t = (feature_spread(torch.cat(v)) if v else float("nan") for v in feats.values())
        return with_knn(Evaluation(f"val spread student {s:.4f} teacher {t:.4f}", dict(val_spread=s),
                                   dict(val_spread=s, spread_teacher=t)), self.knn, model, run.accelerator)
