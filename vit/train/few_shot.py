"""A few-shot table: N labelled images per class, several seeds, each way of using a backbone, on the same
images. k-NN and the linear probe read frozen features (vit.eval.probes); LoRA (vit.train.lora) and full
fine-tuning train a copy of the backbone with a new head, full-batch AdamW on the N x classes images.

    rows = few_shot_rows(backbone, train_x, train_y, test_x, test_y, shots=(1, 5, 10), seeds=(0, 1, 2))
    table = summarize(rows)                  # mean and standard deviation of top-1 per (method, N)
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F

from ..eval.probes import knn_scores, linear_probe
from .lora import add_lora, trainable_share

__all__ = ["METHODS", "sample_per_class", "finetune", "embed", "few_shot_rows", "summarize"]

METHODS = ("knn", "linear", "lora", "full")


def sample_per_class(y: np.ndarray, n: int, seed: int) -> np.ndarray:
    """Indices of `n` samples of every class of `y` (all of a class with fewer), drawn with `seed`, sorted."""
    rng = np.random.default_rng(seed)
    out = [rng.permutation(np.flatnonzero(y == c))[:n] for c in np.unique(y)]
    return np.sort(np.concatenate(out))


@torch.no_grad()
def embed(model, x: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """Pooled pre-logits features (N, D) of images x (N, C, H, W) (vit.eval.features.Embedder's, in memory)."""
    model.eval()
    return torch.cat([model.forward_head(model.forward_features(x[i:i + batch_size]), pre_logits=True)
                      for i in range(0, len(x), batch_size)])


def finetune(backbone, x: torch.Tensor, y: torch.Tensor, num_classes: int, steps: int = 100, lr: float = 1e-3,
             lora_rank: int | None = None, seed: int = 0) -> tuple[torch.nn.Module, float]:
    """A copy of `backbone` with a new `num_classes` head, trained full-batch for `steps` AdamW steps (weight decay
    0.05) on (x, y): every parameter, or with `lora_rank` the LoRA adapters and the head only. -> (model in eval
    mode, the trained share of its parameters)."""
    torch.manual_seed(seed)
    model = copy.deepcopy(backbone)
    model.reset_classifier(num_classes)
    if lora_rank:
        add_lora(model, lora_rank)
    trained, total = trainable_share(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.05)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model.eval(), trained / total


def few_shot_rows(backbone, train_x: torch.Tensor, train_y: np.ndarray, test_x: torch.Tensor, test_y: np.ndarray,
                  shots: tuple[int, ...] = (1, 5, 10), seeds: tuple[int, ...] = (0, 1, 2),
                  methods: tuple[str, ...] = METHODS, steps: int = 100, lr: float = 1e-3, lora_rank: int = 4,
                  lr_lora: float = 1e-2, k: int = 20, temperature: float = 0.07) -> list[dict]:
    """One row {method, shots, seed, top1, trained_share} per method, N in `shots` (0: every training image) and
    seed; labels are class indices 0..K-1. The same N-per-class sample serves every method of a seed."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown few-shot method {unknown[0]!r}; choose from {', '.join(METHODS)}.")
    num_classes = int(max(train_y.max(), test_y.max()) + 1)
    yt = torch.from_numpy(test_y)
    frozen_train = embed(backbone, train_x) if {"knn", "linear"} & set(methods) else None
    frozen_test = embed(backbone, test_x) if frozen_train is not None else None
    rows = []
    for n in shots:
        for seed in seeds:
            idx = sample_per_class(train_y, n if n > 0 else len(train_y), seed)
            xs, ys = train_x[idx], torch.from_numpy(train_y[idx])
            for method in methods:
                share = 0.0
                if method == "knn":
                    scores = knn_scores(frozen_train[idx], ys, frozen_test, num_classes, k, temperature)
                elif method == "linear":
                    scores, _ = linear_probe(frozen_train[idx], ys, frozen_test, num_classes, seed=seed)
                else:
                    model, share = finetune(backbone, xs, ys, num_classes, steps, lr_lora if method == "lora" else lr,
                                            lora_rank if method == "lora" else None, seed)
                    with torch.no_grad():
                        scores = torch.cat([model(test_x[i:i + 256]) for i in range(0, len(test_x), 256)])
                top1 = float((scores.argmax(1) == yt).double().mean())
                rows.append({"method": method, "shots": n, "seed": seed, "top1": top1, "trained_share": share})
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """{method, shots, mean, std (over seeds, ddof 0), seeds} per (method, shots), in the rows' order."""
    keys = list(dict.fromkeys((r["method"], r["shots"]) for r in rows))
    out = []
    for method, n in keys:
        v = np.array([r["top1"] for r in rows if r["method"] == method and r["shots"] == n])
        out.append({"method": method, "shots": n, "mean": float(v.mean()), "std": float(v.std()), "seeds": len(v)})
    return out
