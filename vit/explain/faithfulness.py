"""Do the maps point at what the model uses? Token deletion and insertion on held-out images.

    python faithfulness.py --checkpoint runs/default/best [--limit 360] [--out DIR]     # the command

For every held-out image and every map (attention rollout, gradient rollout, last-layer raw attention, a
random map) the patch tokens are ranked by relevance. Deletion removes them from the input sequence, most
relevant first (a ViT takes a shorter sequence natively, so nothing is painted over); insertion starts from no
patch tokens and adds them back in the same order. The score is the area under the curve of the probability of
the class predicted on the full image (x axis: fraction of patches removed / added, in [0, 1]). Lower deletion
AUC and higher insertion AUC mean a more faithful map. Means come with paired bootstrap 95% intervals
(images resampled together for all methods), and so do the differences between methods.
Pixel blanking is not used: on digits a blank patch carries no evidence, so blanking cannot tell maps apart.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .rollout import attention_maps

__all__ = ["token_curves", "auc", "paired_bootstrap", "evaluate_faithfulness"]

METHODS = ("rollout", "grad_rollout", "attention", "random")


@torch.no_grad()
def token_curves(model, x: torch.Tensor, order: torch.Tensor, target: torch.Tensor, mode: str) -> torch.Tensor:
    """Probability of `target` as patch tokens are deleted (or inserted) in `order` (B, N), most relevant first.
    Returns (B, N + 1): the value after 0, 1, ..., N tokens removed (or added)."""
    B, N = order.shape
    out = []
    for k in range(N + 1):
        keep = order[:, k:] if mode == "deletion" else order[:, :k]
        keep = keep.sort(dim=1).values
        if keep.shape[1] == 0 and getattr(model, "global_pool", "token") == "avg":  # no patch left to pool
            out.append(torch.full((B,), 1.0 / model.num_classes))  # no evidence: chance
            continue
        feats, _ = model.encode(x, patch_keep=keep)
        probs = model.forward_head(feats).softmax(dim=1)
        out.append(probs.gather(1, target[:, None])[:, 0])
    return torch.stack(out, dim=1)


def auc(curves: torch.Tensor) -> torch.Tensor:
    """Trapezoid area under (B, K) curves sampled evenly on [0, 1]."""
    return ((curves[:, 1:] + curves[:, :-1]) / 2).mean(dim=1)


def paired_bootstrap(scores: dict[str, np.ndarray], n: int = 2000, seed: int = 0) -> dict:
    """Mean and 95% interval per method, and for every difference between two methods."""
    rng = np.random.default_rng(seed)
    names = list(scores)
    size = len(scores[names[0]])
    idx = rng.integers(0, size, size=(n, size))
    boots = {m: scores[m][idx].mean(axis=1) for m in names}
    out = {"methods": {}, "differences": {}}
    for m in names:
        lo, hi = np.percentile(boots[m], [2.5, 97.5])
        out["methods"][m] = dict(mean=float(scores[m].mean()), lo=float(lo), hi=float(hi))
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            d = boots[a] - boots[b]
            lo, hi = np.percentile(d, [2.5, 97.5])
            out["differences"][f"{a} - {b}"] = dict(mean=float((scores[a] - scores[b]).mean()), lo=float(lo),
                                                    hi=float(hi), excludes_zero=bool(lo > 0 or hi < 0))
    return out


def evaluate_faithfulness(model, images: torch.Tensor, batch_size: int = 64, seed: int = 0) -> dict:
    """Deletion and insertion AUCs per image and method, their bootstrap summaries and mean curves."""
    gen = torch.Generator().manual_seed(seed)
    per = {mode: {m: [] for m in METHODS} for mode in ("deletion", "insertion")}
    curves = {mode: {m: [] for m in METHODS} for mode in ("deletion", "insertion")}
    for s in range(0, len(images), batch_size):
        x = images[s : s + batch_size]
        with torch.no_grad():
            target = model(x).argmax(1)
        maps = {}
        for m in ("rollout", "grad_rollout", "attention"):
            maps[m] = attention_maps(model, x, m, target_class=target)[0].flatten(1)  # (B, N)
        maps["random"] = torch.rand(maps["rollout"].shape, generator=gen)
        for m, relevance in maps.items():
            order = relevance.argsort(dim=1, descending=True)
            for mode in ("deletion", "insertion"):
                c = token_curves(model, x, order, target, mode)
                curves[mode][m].append(c)
                per[mode][m].append(auc(c))
    result = {}
    for mode in ("deletion", "insertion"):
        scores = {m: torch.cat(per[mode][m]).numpy() for m in METHODS}
        result[mode] = paired_bootstrap(scores, seed=seed)
        result[mode]["mean_curve"] = {m: torch.cat(curves[mode][m]).mean(0).tolist() for m in METHODS}
    result["n_images"] = len(images)
    return result


def format_table(result: dict) -> str:
    lines = [f"{'method':<14}{'deletion AUC (lower is better)':<34}{'insertion AUC (higher is better)':<34}"]
    for m in METHODS:
        cells = []
        for mode in ("deletion", "insertion"):
            r = result[mode]["methods"][m]
            cells.append(f"{r['mean']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]")
        lines.append(f"{m:<14}{cells[0]:<34}{cells[1]:<34}")
    lines.append("")
    lines.append("paired differences (mean [95% CI]):")
    for mode in ("deletion", "insertion"):
        for name, d in result[mode]["differences"].items():
            if name.startswith("rollout") or name.startswith("grad_rollout"):
                flag = "" if d["excludes_zero"] else "   (interval includes 0)"
                lines.append(f"  {mode:<10}{name:<28}{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]{flag}")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    from ..eval.plots import save_figure

    fig = Figure(figsize=(10, 4))
    axes = fig.subplots(1, 2)
    for ax, mode in zip(axes, ("deletion", "insertion")):
        for m in METHODS:
            c = result[mode]["mean_curve"][m]
            xs = np.linspace(0, 1, len(c))
            ax.plot(xs, c, label=f"{m} (AUC {result[mode]['methods'][m]['mean']:.3f})")
        ax.set(xlabel=f"fraction of patch tokens {'removed' if mode == 'deletion' else 'added'}",
               ylabel="probability of the predicted class", title=f"token {mode}")
        ax.legend()
        ax.grid(alpha=0.3)
    save_figure(fig, path, dpi=110)
