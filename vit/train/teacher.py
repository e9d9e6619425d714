"""The distillation teacher: any model `vit.create_model` builds with its weights (a timm name or tag, `hf-hub:`,
`local-dir:`, a train.py checkpoint folder, a CLIP / SigLIP repository's image tower), frozen, always in eval mode,
scoring the student's batch in its own preprocessing.

The batch arrives normalised for the student, x_s = (x - m_s) / s_s per channel; the teacher wants
x_t = (x - m_t) / s_t = x_s * (s_s / s_t) + (m_s - m_t) / s_t, one affine map per channel (timm's
`DistillationTeacher.normalize_input`, its scale and shift folded in float64). When the teacher's input size
differs from the batch's, the batch is resized to it (bilinear, antialiased) after the map.

A NaFlex batch (vit/data/naflex.py: {"patches": (B, N, P*P*C) flattened channels last, "patch_coord",
"patch_valid"}) takes the same map on each pixel's channel and goes to a NaFlex teacher of the same patch size
unchanged otherwise (each image keeps its own grid; nothing is resized).

`weights_hash` is the SHA-256 of the teacher's weights (names, dtypes, shapes, bytes): a resumed run re-loads the
teacher, which is never in the training state, and compares the hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Teacher", "build_teacher", "weights_hash"]


def weights_hash(model: nn.Module) -> str:
    """SHA-256 hex digest of `model.state_dict()`: every entry's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class Teacher(nn.Module):
    """A frozen `model` (timm's API: forward, forward_features, forward_head) that takes batches normalised with
    `student_mean` / `student_std` and sees them normalised with its own `mean` / `std`, at its input size.

    Its parameters never require gradients, `.train()` leaves it in eval mode, and its outputs carry no graph."""

    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float],
                 student_mean: Sequence[float], student_std: Sequence[float], name: str = "the teacher") -> None:
        super().__init__()
        if len(mean) != len(student_mean) or len(std) != len(mean) or len(student_std) != len(student_mean):
            raise ValueError(f"{name} takes {len(mean)}-channel images (mean {list(mean)}) and the student "
                             f"{len(student_mean)}-channel ones (mean {list(student_mean)}); distil between models "
                             f"with the same input channels (model.in_chans={len(mean)} reads grey images as "
                             f"{len(mean)} channels).")
        self.model, self.name = model.eval().requires_grad_(False), name
        m_t, s_t = torch.tensor(mean, dtype=torch.float64), torch.tensor(std, dtype=torch.float64)
        m_s, s_s = torch.tensor(student_mean, dtype=torch.float64), torch.tensor(student_std, dtype=torch.float64)
        self.same_norm = bool(torch.equal(m_t, m_s) and torch.equal(s_t, s_s))
        self.register_buffer("scale", (s_s / s_t).float().view(1, -1, 1, 1), persistent=False)
        self.register_buffer("shift", ((m_s - m_t) / s_t).float().view(1, -1, 1, 1), persistent=False)
        embed = getattr(model, "patch_embed", None)
        self.img_size = tuple(embed.img_size) if getattr(embed, "img_size", None) is not None else None
        self.grid_size = tuple(embed.grid_size) if getattr(embed, "grid_size", None) is not None else None
        self.num_classes = getattr(model, "num_classes", None)
        self.num_features = getattr(model, "num_features", None)
        from ..models.naflex_vit import NaFlexVit

        self.naflex = isinstance(model, NaFlexVit)  # takes NaFlex batch dicts
        self.digest = weights_hash(model)

    def train(self, mode: bool = True) -> Teacher:
        super().train(mode)
        self.model.eval()  # dropout, drop path and batch statistics stay off whatever the wrapper is told
        return self

    def prepare(self, images: torch.Tensor | dict) -> torch.Tensor | dict:
        """(B, C, H, W) normalised for the student -> normalised for the teacher, at its input size; a NaFlex batch
        dict -> the same dict with its patches normalised for the teacher."""
        if isinstance(images, dict):
            return self._prepare_naflex(images)
        x = images if self.same_norm else images * self.scale.to(images.dtype) + self.shift.to(images.dtype)
        if self.img_size is not None and tuple(x.shape[-2:]) != self.img_size:
            x = F.interpolate(x, size=self.img_size, mode="bilinear", align_corners=False, antialias=True)
        return x

    def require_naflex(self, patch_size: int | tuple[int, int]) -> None:
        """Raise one ValueError sentence unless the teacher takes NaFlex batches of `patch_size` patches."""
        want = tuple(patch_size) if isinstance(patch_size, (tuple, list)) else (patch_size, patch_size)
        size = getattr(getattr(self.model, "patch_embed", None), "patch_size", None)
        if not self.naflex or tuple(size) != want:
            have = f"{type(self.model).__name__} (patch size {tuple(size) if size is not None else 'none'})"
            raise ValueError(f"this run feeds NaFlex batches of {want[0]}x{want[1]} patches, and the teacher "
                             f"{self.name} is {have}; give a NaFlex teacher of the student's patch size (a "
                             "naflexvit_* model or a train.py NaFlex checkpoint) or remove data.naflex.")

    def _prepare_naflex(self, batch: dict) -> dict:
        patches = batch["patches"]  # (B, N, P*P*C), each patch's pixels row by row, channels last
        C, (B, N, F_) = self.scale.numel(), patches.shape
        side = round((F_ // C) ** 0.5)
        self.require_naflex(side if side * side * C == F_ else (F_ // C, 1))
        if self.same_norm:
            return batch
        pixels = patches.view(B, N, F_ // C, C)
        pixels = pixels * self.scale.view(C).to(pixels.dtype) + self.shift.view(C).to(pixels.dtype)
        return {**batch, "patches": pixels.view(B, N, F_)}

    @torch.no_grad()
    def logits(self, images: torch.Tensor) -> torch.Tensor:
        """The teacher's class scores (B, num_classes) of a student batch."""
        return self.model(self.prepare(images))

    @torch.no_grad()
    def features(self, images: torch.Tensor, patch: bool = False) -> torch.Tensor:
        """The pooled pre-logits features (B, D) of a student batch, or with `patch` its patch tokens (B, N, D)."""
        x = self.model.forward_features(self.prepare(images))  # (B, prefix + N, D); NaFlex: a dict with patch_valid
        return x[:, self.model.num_prefix_tokens:] if patch else self.model.forward_head(x, pre_logits=True)


def _check_teacher_path(name: str) -> None:
    """One sentence for a teacher named by a path that cannot be one: missing, a file, or a run folder whose
    checkpoints are below it."""
    import os

    p = Path(name).expanduser()
    where = "name a train.py checkpoint folder (a run's best/ or last/), a timm tag, hf-hub:org/repo or local-dir:"
    if (os.sep in name or name.startswith((".", "~"))) and ":" not in name.split(os.sep)[0] and not p.exists():
        raise ValueError(f"distill.teacher {name!r} does not exist; {where}.")
    if p.is_file():
        raise ValueError(f"distill.teacher {name!r} is a file; name the checkpoint folder that holds it with its "
                         f"config.json ({p.parent}).")
    if p.is_dir() and not (p / "config.json").is_file():
        inside = [s for s in ("best", "last") if (p / s / "config.json").is_file()]
        if inside:
            raise ValueError(f"distill.teacher {name!r} is a run folder; name one of its checkpoints, "
                             f"{p / inside[0]}.")


def build_teacher(source: str | Path | nn.Module, student_mean: Sequence[float], student_std: Sequence[float],
                  mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                  cache_dir: str | Path | None = None) -> Teacher:
    """The Teacher `source` names, with its weights: anything `vit.create_model(source, pretrained=True)` takes (a
    timm name or tag in the Hugging Face cache, `hf-hub:org/repo`, `local-dir:/folder`, a CLIP / SigLIP
    repository, whose image tower it builds), a train.py checkpoint folder, or a model already built. Its
    preprocessing is its pretrained config's mean and std unless `mean` / `std` are given. A source that does not
    build is one ValueError sentence naming it."""
    from ..models import create_model  # models sit below train; imported here so `import vit.train` stays light

    if isinstance(source, nn.Module):
        model, name = source, f"the teacher ({type(source).__name__})"
    else:
        name = str(source)
        _check_teacher_path(name)
        spec = f"local-dir:{Path(name).resolve()}" if Path(name).is_dir() else name
        try:
            model = create_model(spec, pretrained=True, cache_dir=cache_dir)
        except Exception as e:  # a missing file, an unknown name, weights of another model: all one sentence
            first = (str(e).splitlines() or [type(e).__name__])[0].rstrip(".")
            raise ValueError(f"distill.teacher {name!r} does not build as a teacher ({first}); name a model with "
                             "weights: a timm tag in the Hugging Face cache, hf-hub:org/repo, local-dir:/folder, "
                             "a train.py checkpoint folder or a CLIP / SigLIP repository.") from None
    cfg = getattr(model, "pretrained_cfg", None) or {}
    mean = tuple(mean if mean is not None else cfg.get("mean", (0.485, 0.456, 0.406)))
    std = tuple(std if std is not None else cfg.get("std", (0.229, 0.224, 0.225)))
    return Teacher(model, mean, std, student_mean, student_std, name=name)
