"""Pictures a user looks at: training curves, confusion matrix, reliability diagram, attention overlays.

Each picture is a `matplotlib.figure.Figure` drawn and saved without pyplot: importing this module changes no
global state (no backend switch, no rcParams), so a notebook or an application that embeds us keeps its own, and
nothing is left open in pyplot's figure registry. `Figure.savefig` renders through the Agg canvas by itself.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = ["plot_curves", "plot_confusion", "plot_reliability", "save_figure", "plot_attention_map", "to_display",
           "curves_figure", "reliability_figure", "attention_figure", "reliability_bars"]

MARKERS_UP_TO = 30  # epochs: a point marker on each, so that a 2-epoch run shows two points, not a bare line


def save_figure(fig: Figure, path: str | Path, dpi: int = 120) -> None:
    """Render a figure to PNG in memory and write the file atomically."""
    from ..utils.atomic import atomic_write_bytes

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())


def plot_curves(metrics_csv: str | Path, out_png: str | Path) -> None:
    """Loss and accuracy per epoch from a run's metrics.csv (nothing is written for a file without rows)."""
    with open(metrics_csv) as f:
        rows = [r for r in csv.DictReader(f)]
    if rows:
        save_figure(curves_figure(rows), Path(out_png))


def curves_figure(rows: list[dict]) -> Figure:
    """metrics.csv rows -> loss | held-out top-1 per epoch; whole-number epoch ticks, markers on short runs."""
    ep = [float(r["epoch"]) for r in rows]
    marker = "o" if len(rows) <= MARKERS_UP_TO else None

    def col(name):
        return [float(r[name]) if r.get(name) not in (None, "") else np.nan for r in rows]

    fig = Figure(figsize=(10, 4))
    a1, a2 = fig.subplots(1, 2)
    a1.plot(ep, col("train_loss"), label="train", marker=marker)
    a1.plot(ep, col("val_loss"), label="val", marker=marker)
    a1.set(xlabel="epoch", ylabel="loss", title="loss")
    a1.legend()
    a2.plot(ep, [100 * v for v in col("val_acc1")], label="val top-1", marker=marker)
    a2.set(xlabel="epoch", ylabel="accuracy (%)", title="held-out accuracy")
    a2.legend()
    a2.grid(alpha=0.3)
    for a in (a1, a2):
        a.xaxis.set_major_locator(MaxNLocator(integer=True))  # epoch 1, 2, 3: never 1.5
    return fig


def plot_confusion(matrix: np.ndarray, classes: list[str], out_png: str | Path) -> None:
    """Row-normalized confusion matrix (rows: true class, columns: predicted)."""
    norm = matrix / np.maximum(1, matrix.sum(axis=1, keepdims=True))
    n = len(classes)
    size = max(4, min(20, 0.45 * n + 2))
    fig = Figure(figsize=(size, size))
    ax = fig.subplots()
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


def reliability_bars(bins: list) -> tuple[np.ndarray, ...]:
    """The bins a reliability diagram draws: (lower edge, width, count, accuracy, confidence) of each non-empty
    bin. An empty bin has no accuracy; drawing it as 0 (or a bin of 1-2 samples as a full bar without its count)
    makes a calibrated model look badly calibrated."""
    kept = [b for b in bins if b[2] > 0]
    if not kept:
        return tuple(np.zeros(0) for _ in range(5))
    lo, hi, n, acc, conf = (np.array(v, dtype=float) for v in zip(*kept))
    return lo, hi - lo, n, acc, conf


def plot_reliability(bins: list, ece: float, out_png: str | Path) -> None:
    """The reliability diagram of `expected_calibration_error`'s bins as a PNG (see reliability_figure)."""
    save_figure(reliability_figure(bins, ece), Path(out_png))


def reliability_figure(bins: list, ece: float) -> Figure:
    """Accuracy against confidence per bin (Guo et al., 2017, Fig. 1), empty bins left out. A bar's colour
    deepens with its share of the samples and its count is written on it; below, the confidence histogram
    (samples per bin, log scale) says which bars carry weight. The diagonal is perfect calibration; the red
    outline is each bin's gap from it (ECE is the count-weighted mean gap)."""
    from matplotlib import colormaps

    lo, width, n, acc, conf = reliability_bars(bins)
    total = max(1.0, n.sum())
    fig = Figure(figsize=(5, 6.2))
    ax, hist = fig.subplots(2, 1, sharex=True, gridspec_kw=dict(height_ratios=(3, 1), hspace=0.08))
    shade = colormaps["Blues"](0.25 + 0.75 * np.sqrt(n / max(1.0, n.max())))  # sqrt: small bins stay visible
    ax.bar(lo, acc, width=width, align="edge", color=shade, edgecolor="black", linewidth=0.6, label="accuracy")
    ax.bar(lo, conf - acc, bottom=acc, width=width, align="edge", fill=False, edgecolor="tab:red", hatch="//",
           linewidth=0.6, label="gap to confidence")
    for x, w, a, c, k in zip(lo, width, acc, conf, n):  # above the bar and its gap outline
        ax.text(x + w / 2, max(a, c) + 0.01, f"{int(k)}", ha="center", va="bottom", fontsize=6)
    ax.plot([0, 1], [0, 1], "k--", linewidth=1, label="perfect calibration")
    ax.set(ylabel="accuracy", title=f"reliability (ECE {ece:.3f}, {int(total)} samples; numbers: samples per bin)",
           xlim=(0, 1), ylim=(0, 1.1))
    ax.title.set_fontsize(9)
    ax.legend(loc="upper left", fontsize=8)
    hist.bar(lo, n, width=width, align="edge", color="grey", edgecolor="black", linewidth=0.6)
    hist.set(xlabel="confidence", ylabel="samples", yscale="log" if len(n) and n.max() > 10 * n.min() else "linear")
    return fig


def to_display(x, mean, std) -> np.ndarray:
    """A normalized (C, H, W) tensor back to what the model saw, as (H, W, C) floats in [0, 1] for display."""
    img = (x.permute(1, 2, 0).numpy() * np.array(std) + np.array(mean)).clip(0, 1)
    return img.repeat(3, axis=2) if img.shape[2] == 1 else img  # grey (model.in_chans=1) shown as RGB


def plot_attention_map(path: Path, image: np.ndarray, grid_map: np.ndarray, title: str) -> None:
    """The attention picture of one image as a PNG (see attention_figure)."""
    save_figure(attention_figure(image, grid_map, title), path, dpi=100)


def attention_figure(image: np.ndarray, grid_map: np.ndarray, title: str) -> Figure:
    """Input (H, W, C) in [0, 1] | patch-grid map (h, w) | map upsampled (bicubic) over the input, with a colour
    bar for the map's scale: the map is shifted and scaled to [0, 1] (its minimum to 0, its maximum to 1), so
    the colours rank patches within one image and are not comparable across images."""
    import cv2

    h, w = image.shape[:2]
    m = grid_map - grid_map.min()
    m = m / m.max() if m.max() > 0 else m
    heat = cv2.resize(m.astype(np.float32), (w, h), interpolation=cv2.INTER_CUBIC).clip(0, 1)
    fig = Figure(figsize=(10, 3.5))
    axes = fig.subplots(1, 3)
    axes[0].imshow(image)
    axes[0].set_title("input")
    im = axes[1].imshow(m, cmap="jet", interpolation="nearest", vmin=0, vmax=1)
    axes[1].set_title(f"map ({m.shape[0]}x{m.shape[1]} patches)")
    axes[2].imshow(image)
    axes[2].imshow(heat, cmap="jet", alpha=0.5, vmin=0, vmax=1)
    axes[2].set_title("overlay")
    for a in axes:
        a.axis("off")
    fig.colorbar(im, ax=list(axes), fraction=0.025, pad=0.02, label="relevance (min-max scaled)")
    fig.suptitle(title, fontsize=9)
    return fig
