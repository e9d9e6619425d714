"""Pictures a user looks at: training curves, confusion matrix, reliability diagram (matplotlib, headless)."""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

__all__ = ["plot_curves", "plot_confusion", "plot_reliability", "save_figure", "plot_attention_map", "to_display"]


def save_figure(fig, path: str | Path, dpi: int = 120) -> None:
    """Render a figure to PNG in memory, close it, and write the file atomically."""
    import io

    from .atomic import atomic_write_bytes

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def plot_curves(metrics_csv: str | Path, out_png: str | Path) -> None:
    """Loss and accuracy per epoch from a run's metrics.csv."""
    with open(metrics_csv) as f:
        rows = [r for r in csv.DictReader(f)]
    if not rows:
        return
    ep = [float(r["epoch"]) for r in rows]

    def col(name):
        return [float(r[name]) if r.get(name) not in (None, "") else np.nan for r in rows]

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    a1.plot(ep, col("train_loss"), label="train")
    a1.plot(ep, col("val_loss"), label="val")
    a1.set(xlabel="epoch", ylabel="loss", title="loss")
    a1.legend()
    a2.plot(ep, [100 * v for v in col("val_acc1")], label="val top-1")
    a2.set(xlabel="epoch", ylabel="accuracy (%)", title="held-out accuracy")
    a2.legend()
    a2.grid(alpha=0.3)
    save_figure(fig, Path(out_png))


def plot_confusion(matrix: np.ndarray, classes: list[str], out_png: str | Path) -> None:
    """Row-normalized confusion matrix (rows: true class, columns: predicted)."""
    norm = matrix / np.maximum(1, matrix.sum(axis=1, keepdims=True))
    n = len(classes)
    size = max(4, min(20, 0.45 * n + 2))
    fig, ax = plt.subplots(figsize=(size, size))
    im = ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    ax.set(xticks=range(n), yticks=range(n), xlabel="predicted", ylabel="true", title="confusion (row-normalized)")
    ax.set_xticklabels(classes, rotation=90 if n > 10 else 0)
    ax.set_yticklabels(classes)
    if n <= 20:
        for i in range(n):
            for j in range(n):
                if norm[i, j] >= 0.005:
                    ax.text(j, i, f"{norm[i, j]:.2f}", ha="center", va="center", fontsize=7,
                            color="white" if norm[i, j] > 0.5 else "black")
    fig.colorbar(im, ax=ax, fraction=0.046)
    save_figure(fig, Path(out_png))


def plot_reliability(bins: list, ece: float, out_png: str | Path) -> None:
    """Accuracy against confidence per bin; the diagonal is perfect calibration."""
    fig, ax = plt.subplots(figsize=(5, 5))
    lo = [b[0] for b in bins]
    width = bins[0][1] - bins[0][0]
    acc = [b[3] if b[2] else 0 for b in bins]
    ax.bar(lo, acc, width=width, align="edge", edgecolor="black", label="accuracy")
    ax.plot([0, 1], [0, 1], "k--", label="perfect calibration")
    ax.set(xlabel="confidence", ylabel="accuracy", title=f"reliability (ECE {ece:.3f})", xlim=(0, 1), ylim=(0, 1))
    ax.legend(loc="upper left")
    save_figure(fig, Path(out_png))


def to_display(x, mean, std) -> np.ndarray:
    """A normalized (C, H, W) tensor back to what the model saw, as (H, W, C) floats in [0, 1] for display."""
    return (x.permute(1, 2, 0).numpy() * np.array(std) + np.array(mean)).clip(0, 1)


def plot_attention_map(path: Path, image: np.ndarray, grid_map: np.ndarray, title: str) -> None:
    """Input | patch-grid map | map upsampled (bicubic) over the input, in one PNG."""
    import cv2

    h, w = image.shape[:2]
    m = grid_map - grid_map.min()
    m = m / m.max() if m.max() > 0 else m
    heat = cv2.resize(m.astype(np.float32), (w, h), interpolation=cv2.INTER_CUBIC).clip(0, 1)
    fig, axes = plt.subplots(1, 3, figsize=(9, 3.3))
    axes[0].imshow(image)
    axes[0].set_title("input")
    axes[1].imshow(m, cmap="jet", interpolation="nearest")
    axes[1].set_title(f"map ({m.shape[0]}x{m.shape[1]} patches)")
    axes[2].imshow(image)
    axes[2].imshow(heat, cmap="jet", alpha=0.5)
    axes[2].set_title("overlay")
    for a in axes:
        a.axis("off")
    fig.suptitle(title)
    save_figure(fig, path, dpi=100)
