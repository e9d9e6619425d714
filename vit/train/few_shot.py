"""A few-shot table: N labelled images per class, several seeds, each way of using a backbone, on the same
images. k-NN and the linear probe read frozen features (vit.eval.probes); LoRA (vit.train.lora) and full
fine-tuning train a copy of the backbone with a new head, full-batch AdamW on the N x classes images.

    rows = few_shot_rows(backbone, train_x, train_y, test_x, test_y, shots=(1, 5, 10), seeds=(0, 1, 2))
    table = summarize(rows)                  # mean and standard deviation of top-1 per (method, N)
"""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import torch
import torch.nn.functional as F

from ..config import AugConfig, OptimConfig
from ..eval.features import Embedder
from ..eval.probes import knn_scores, linear_probe
from .lora import add_lora, trainable_share
from .optim import build_optimizer, lr_at, set_lr

__all__ = ["METHODS", "FEATURES", "FINETUNE", "sample_per_class", "random_affine", "finetune", "embed", "few_shot_rows",
           "summarize"]

METHODS = ("knn", "linear", "lora", "full")
# what the frozen methods read: the pooled embedding the head reads, or the final patch tokens in grid order,
# flattened (features.py --patch-tokens): on a backbone trained on a narrow task the pooled [CLS] keeps what told
# its own classes apart, the patch grid keeps where things are (the digits transfer of docs/few-labels.md)
FEATURES = ("pooled", "patches")
# configs/default.yaml's recipe (AdamW at 1e-3 without decay on norms and biases, warmup, cosine, clipping; with the
# backbone's augmentation and label smoothing). On the digits transfer, 5 labels per class, 3 seeds: 82.5% top-1,
# 81.6% with layer decay 0.75, 73.2% at finetune_imagefolder.yaml's lr 3e-4, 55.7% for plain AdamW without
# augmentation
FINETUNE = OptimConfig(lr=1e-3, warmup_epochs=5, clip_grad=1.0)


def sample_per_class(y: np.ndarray, n: int, seed: int) -> np.ndarray:
    """Indices of `n` samples of every class of `y` (all of a class with fewer), drawn with `seed`, sorted."""
    rng = np.random.default_rng(seed)
    out = [rng.permutation(np.flatnonzero(y == c))[:n] for c in np.unique(y)]
    return np.sort(np.concatenate(out))


@torch.no_grad()
def embed(model, x: torch.Tensor, batch_size: int = 256, features: str = "pooled") -> torch.Tensor:
    """Frozen features of images x (N, C, H, W), in memory, as vit.eval.features.Embedder gives them: the pooled
    pre-logits (N, D) or, for `features="patches"`, the final patch tokens flattened in grid order (N, h*w*D)."""
    if features not in FEATURES:
        raise ValueError(f"unknown features {features!r}; choose from {', '.join(FEATURES)}.")
    model.eval()
    patches = features == "patches"
    embedder = Embedder(model, patch_tokens=patches)  # (B, D), or (B, D + h*w*D) with the patch tokens after
    out = torch.cat([embedder(x[i:i + batch_size]) for i in range(0, len(x), batch_size)])
    return out[:, model.num_features:] if patches else out


def random_affine(x: torch.Tensor, translate: float, rotate: float, scale: float, fill: torch.Tensor,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Each image of x (N, C, H, W) shifted by up to +-translate of its size, turned by up to +-rotate degrees and
    scaled by 1 +- scale (uniform draws, as the training pipeline's albumentations Affine), the uncovered border
    filled with `fill` (C,): what a black pixel normalises to, as Affine pads with 0."""
    n = len(x)
    u = torch.rand(n, 4, generator=generator, dtype=torch.float64) * 2 - 1  # (N, 4) in [-1, 1)
    angle, s = u[:, 0] * rotate * math.pi / 180, 1 + u[:, 1] * scale
    t = 2 * translate * u[:, 2:]  # (N, 2) shift in grid units ([-1, 1] spans the image)
    # the grid maps output pixels to input pixels: the inverse of shift . rotate . scale, p_in = A (p_out - t)
    cos, sin = torch.cos(angle) / s, torch.sin(angle) / s
    a = torch.stack([torch.stack([cos, -sin], 1), torch.stack([sin, cos], 1)], 1)  # (N, 2, 2)
    theta = torch.cat([a, -(a @ t[:, :, None])], 2)  # (N, 2, 3)
    grid = F.affine_grid(theta.to(x), list(x.shape), align_corners=False)
    fill = fill.to(x).view(1, -1, 1, 1)
    return F.grid_sample(x - fill, grid, mode="bilinear", padding_mode="zeros", align_corners=False) + fill


def finetune(backbone, x: torch.Tensor, y: torch.Tensor, num_classes: int, optim: OptimConfig,
             aug: AugConfig | None = None, steps: int = 600, lora_rank: int | None = None, seed: int = 0
             ) -> tuple[torch.nn.Module, float]:
    """A copy of `backbone` with a new `num_classes` head, trained on (x, y) by the fine-tuning recipe in `optim`
    (AdamW with timm's parameter groups and optim.layer_decay, warmup then cosine, gradient clipping) for `steps`
    full-batch steps (N x classes images fit one batch: a step is an epoch, optim.warmup_epochs counts steps), each
    on a fresh draw of aug's affine augmentation and horizontal flip, with its label smoothing. Every parameter, or
    with `lora_rank` the LoRA adapters (scale optim.lora_alpha / rank) and the head. -> (model in eval mode, the
    trained share of its parameters)."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = copy.deepcopy(backbone)
    model.reset_classifier(num_classes)
    if lora_rank:
        add_lora(model, lora_rank, optim.lora_alpha)
    trained, total = trainable_share(model)
    opt = build_optimizer(model, optim)
    params = [p for p in model.parameters() if p.requires_grad]
    fill = None
    if aug is not None:
        mean, std = torch.tensor(aug.mean), torch.tensor(aug.std)
        fill = -mean / std  # a black pixel (0) after normalisation, (C,)
    model.train()
    for step in range(steps):
        set_lr(opt, lr_at(step, steps, int(round(optim.warmup_epochs)), optim.lr, optim.min_lr))
        xb = x
        if aug is not None:
            if aug.affine_translate or aug.affine_rotate or aug.affine_scale:
                xb = random_affine(xb, aug.affine_translate, aug.affine_rotate, aug.affine_scale, fill, gen)
            if aug.hflip:
                flip = torch.rand(len(xb), generator=gen) < aug.hflip
                xb = torch.where(flip[:, None, None, None], xb.flip(-1), xb)
        opt.zero_grad()
        F.cross_entropy(model(xb), y, label_smoothing=aug.label_smoothing if aug is not None else 0.0).backward()
        if optim.clip_grad:
            torch.nn.utils.clip_grad_norm_(params, optim.clip_grad)
        opt.step()
    return model.eval(), trained / total


def few_shot_rows(backbone, train_x: torch.Tensor, train_y: np.ndarray, test_x: torch.Tensor, test_y: np.ndarray,
                  shots: tuple[int, ...] = (1, 5, 10), seeds: tuple[int, ...] = (0, 1, 2),
                  methods: tuple[str, ...] = METHODS, optim: OptimConfig = FINETUNE, aug: AugConfig | None = None,
                  steps: int = 600, lora_rank: int = 4, lr_lora: float = 1e-2, k: int = 20,
                  temperature: float = 0.07, features: tuple[str, ...] = ("pooled",)) -> list[dict]:
    """One row {method, shots, seed, top1, trained_share} per method, N in `shots` (0: every training image) and
    seed; labels are class indices 0..K-1. The same N-per-class sample serves every method of a seed. k-NN and the
    linear probe run once per kind of `features` (FEATURES; on patch tokens their rows are named knn-patches and
    linear-patches). Full fine-tuning follows `optim` and `aug` (finetune); LoRA the same at `lr_lora`, without
    layer decay."""
    unknown = [m for m in methods if m not in METHODS] + [f for f in features if f not in FEATURES]
    if unknown:
        raise ValueError(f"unknown few-shot method or features {unknown[0]!r}; choose methods from "
                         f"{', '.join(METHODS)} and features from {', '.join(FEATURES)}.")
    features = tuple(dict.fromkeys(features))  # a kind named twice: one set of rows
    if not features and {"knn", "linear"} & set(methods):
        raise ValueError(f"k-NN and the linear probe need features to read; pass one or more of {', '.join(FEATURES)}.")
    num_classes = int(max(train_y.max(), test_y.max()) + 1)
    yt = torch.from_numpy(test_y)
    frozen = {}  # features kind -> (train (N, F), test (M, F))
    if {"knn", "linear"} & set(methods):
        frozen = {f: (embed(backbone, train_x, features=f), embed(backbone, test_x, features=f)) for f in features}
    runs = [(m, f) for m in methods for f in (features if m in ("knn", "linear") else ("",))]
    rows = []
    for n in shots:
        for seed in seeds:
            idx = sample_per_class(train_y, n if n > 0 else len(train_y), seed)
            xs, ys = train_x[idx], torch.from_numpy(train_y[idx])
            for method, kind in runs:
                share = 0.0
                if method == "knn":
                    scores = knn_scores(frozen[kind][0][idx], ys, frozen[kind][1], num_classes, k, temperature)
                elif method == "linear":
                    scores, _ = linear_probe(frozen[kind][0][idx], ys, frozen[kind][1], num_classes, seed=seed)
                else:
                    lora = method == "lora"
                    recipe = dataclasses.replace(optim, lr=lr_lora, layer_decay=None) if lora else optim
                    model, share = finetune(backbone, xs, ys, num_classes, recipe, aug, steps,
                                            lora_rank if lora else None, seed)
                    with torch.no_grad():
                        scores = torch.cat([model(test_x[i:i + 256]) for i in range(0, len(test_x), 256)])
                top1 = float((scores.argmax(1) == yt).double().mean())
                name = method if kind in ("", "pooled") else f"{method}-{kind}"
                rows.append({"method": name, "shots": n, "seed": seed, "top1": top1, "trained_share": share})
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """{method, shots, mean, std (over seeds, ddof 0), seeds} per (method, shots), in the rows' order."""
    keys = list(dict.fromkeys((r["method"], r["shots"]) for r in rows))
    out = []
    for method, n in keys:
        v = np.array([r["top1"] for r in rows if r["method"] == method and r["shots"] == n])
        out.append({"method": method, "shots": n, "mean": float(v.mean()), "std": float(v.std()), "seeds": len(v)})
    return out
