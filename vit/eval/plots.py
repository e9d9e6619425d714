"""Pictures a user looks at: training curves, confusion matrix, reliability diagram, attention overlays, MAE's
reconstructions.

Each picture is a `matplotlib.figure.Figure` drawn and saved without pyplot: importing this module changes no
global state (no backend switch, no rcParams), so a notebook or an application that embeds us keeps its own, and
nothing is left open in pyplot's figure registry. `Figure.savefig` renders through the Agg canvas by itself.
matplotlib is imported when a picture is drawn, not with this module: a script that stops early never pays it.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_curves", "plot_confusion", "plot_reliability", "save_figure", "plot_attention_map", "to_display",
           "plot_anomaly_maps",
           "curves_figure", "reliability_figure", "attention_figure", "reliability_bars", "scaled_heat",
           "overlay_image", "confusion_figure", "plot_mistakes", "mistakes_figure", "plot_reconstructions",
           "reconstructions_figure"]

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
    """metrics.csv rows -> loss | held-out top-1 | learning rate per epoch. Every epoch has a row (train loss, lr);
    the val_* values only those evaluated (run.eval_every), each series drawn through its own points. Whole-number
    epoch ticks, markers on short runs."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    marker = "o" if len(rows) <= MARKERS_UP_TO else None

    def series(name, scale=1.0):
        pts = [(float(r["epoch"]), scale * float(r[name])) for r in rows if r.get(name) not in (None, "")]
        return [p[0] for p in pts], [p[1] for p in pts]

    fig = Figure(figsize=(13, 4))
    a1, a2, a3 = fig.subplots(1, 3)
    a1.plot(*series("train_loss"), label="train (every epoch)", marker=marker)
    a1.plot(*series("val_loss"), label="val", marker=marker)
    a1.set(xlabel="epoch", ylabel="loss", title="loss")
    a1.legend()
    a2.plot(*series("val_acc1", 100), label="val top-1", marker=marker)
    a2.set(xlabel="epoch", ylabel="accuracy (%)", title="held-out accuracy")
    a2.legend()
    a3.plot(*series("lr"), color="tab:green", marker=marker)
    a3.set(xlabel="epoch", ylabel="learning rate", title="learning rate (at each epoch's end)")
    a3.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    for a in (a1, a2, a3):
        a.grid(alpha=0.3)
        a.xaxis.set_major_locator(MaxNLocator(integer=True))  # epoch 1, 2, 3: never 1.5
    fig.tight_layout()
    return fig


def plot_confusion(matrix: np.ndarray, classes: list[str], out_png: str | Path) -> None:
    """The confusion matrix as a PNG (see confusion_figure)."""
    save_figure(confusion_figure(matrix, classes), Path(out_png))


def confusion_figure(matrix: np.ndarray, classes: list[str]) -> Figure:
    """Confusion matrix (rows: true class, columns: predicted), coloured by the row-normalized rate; each cell
    (up to 20 classes) shows its rate and its count, each row label its class's number of images. Empty cells
    off the diagonal are left blank."""
    from matplotlib.figure import Figure

    norm = matrix / np.maximum(1, matrix.sum(axis=1, keepdims=True))
    n = len(classes)
    size = max(4.5, min(20, 0.6 * n + 2))
    fig = Figure(figsize=(size, size))
    ax = fig.subplots()
    im = ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    ax.set(xticks=range(n), yticks=range(n), xlabel="predicted", ylabel="true (images)",
           title="confusion: rate of the true class's images\n(count below)")
    ax.set_xticklabels(classes, rotation=90 if n > 6 else 0)
    ax.set_yticklabels([f"{c} ({int(t)})" for c, t in zip(classes, matrix.sum(axis=1))])
    if n <= 20:
        for i in range(n):
            for j in range(n):
                if matrix[i, j] or i == j:
                    ax.text(j, i, f"{norm[i, j]:.2f}\n({int(matrix[i, j])})", ha="center", va="center",
                            fontsize=8 if n <= 10 else 6, color="white" if norm[i, j] > 0.5 else "black")
    fig.colorbar(im, ax=ax, fraction=0.046, label="rate (row-normalized)")
    return fig


def plot_mistakes(images: list[np.ndarray], titles: list[str], out_png: str | Path) -> None:
    """The gallery of mistakes as a PNG (see mistakes_figure)."""
    save_figure(mistakes_figure(images, titles), Path(out_png), dpi=100)


def mistakes_figure(images: list[np.ndarray], titles: list[str], columns: int = 4) -> Figure:
    """A grid of images (H, W, 3) in [0, 1], each titled (e.g. 'true cat / predicted dog 97%'), most confident
    mistake first; an empty list gives a figure that says there were none."""
    from matplotlib.figure import Figure

    if not images:
        fig = Figure(figsize=(4, 1.2))
        fig.text(0.5, 0.5, "no misclassified images", ha="center", va="center", fontsize=11)
        return fig
    cols = min(columns, len(images))
    rows = -(-len(images) // cols)
    fig = Figure(figsize=(2.6 * cols, 2.9 * rows))
    axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
    for ax in axes:
        ax.axis("off")
    for ax, img, title in zip(axes, images, titles):
        ax.imshow(img, interpolation="nearest")
        ax.set_title(title, fontsize=9)
    fig.suptitle("most confident mistakes (what the model saw)", fontsize=11)
    return fig


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
    from matplotlib.figure import Figure

    lo, width, n, acc, conf = reliability_bars(bins)
    total = max(1.0, n.sum())
    fig = Figure(figsize=(6, 7))
    ax, hist = fig.subplots(2, 1, sharex=True, gridspec_kw=dict(height_ratios=(3, 1), hspace=0.08))
    shade = colormaps["Blues"](0.25 + 0.75 * np.sqrt(n / max(1.0, n.max())))  # sqrt: small bins stay visible
    ax.bar(lo, acc, width=width, align="edge", color=shade, edgecolor="black", linewidth=0.6, label="accuracy")
    ax.bar(lo, conf - acc, bottom=acc, width=width, align="edge", fill=False, edgecolor="tab:red", hatch="//",
           linewidth=0.6, label="gap to confidence")
    for x, w, a, c, k in zip(lo, width, acc, conf, n):  # above the bar and its gap outline
        ax.text(x + w / 2, max(a, c) + 0.01, f"{int(k)}", ha="center", va="bottom", fontsize=8)
    ax.plot([0, 1], [0, 1], "k--", linewidth=1, label="perfect calibration")
    ax.set(ylabel="accuracy in the bin (share correct)", xlim=(0, 1), ylim=(0, 1.12),
           xticks=np.linspace(0, 1, 11), yticks=np.linspace(0, 1, 6))
    ax.set_title(f"reliability: ECE {ece:.3f} over {int(total)} images\n(number on a bar: images in that bin)",
                 fontsize=11)
    ax.grid(alpha=0.25)
    ax.legend(loc="upper left", fontsize=9)
    hist.bar(lo, n, width=width, align="edge", color="grey", edgecolor="black", linewidth=0.6)
    hist.set(xlabel="confidence (top-1 probability)", ylabel="images",
             yscale="log" if len(n) and n.max() > 10 * n.min() else "linear")
    for a in (ax, hist):
        a.xaxis.label.set_fontsize(10)
        a.yaxis.label.set_fontsize(10)
        a.tick_params(labelsize=9)
    return fig


def to_display(x, mean, std) -> np.ndarray:
    """A normalized (C, H, W) tensor or array back to what the model saw, as (H, W, C) floats in [0, 1] for display."""
    img = (np.asarray(x).transpose(1, 2, 0) * np.array(std) + np.array(mean)).clip(0, 1)
    return img.repeat(3, axis=2) if img.shape[2] == 1 else img  # grey (model.in_chans=1) shown as RGB


def plot_attention_map(path: Path, image: np.ndarray, grid_map: np.ndarray, title: str,
                       scale: tuple[float, float] | None = None) -> None:
    """The attention picture of one image as a PNG (see attention_figure)."""
    save_figure(attention_figure(image, grid_map, title, scale), path, dpi=100)


def plot_anomaly_maps(seen, rows: list[dict], good: list[int], maps, out: Path, final: Path | None = None,
                      threshold: float | None = None) -> None:
    """Each readable image's anomaly heat map drawn as the rollout pictures are, into `out`/cam/<i>_<name>_anomaly.png,
    every map on one colour scale: 0 to twice `threshold` (the threshold the middle colour), or without one 0 to the
    highest patch score of them all. `good`: the readable inputs' indices, in the order of `rows`; `maps[i]`: input
    i's patch scores (h, w); `seen(i)`: what the model saw of it, (H, W, 3) in [0, 1]. Each row's `anomaly_map` names
    its picture as it will be in `final` (the folder `out` is moved to). NumPy and matplotlib only: the PyTorch
    predictor and the torch-free one draw with it."""
    top = max((float(maps[i].max()) for i in good), default=1.0)
    scale = (0.0, 2 * threshold) if threshold else (0.0, top)
    for i, row in zip(good, rows):
        path = out / "cam" / f"{i:06d}_{Path(row['path']).stem}_anomaly.png"
        title = (f"{Path(row['path']).name}: anomaly score {row['anomaly_score']:.3f} {row['verdict']}  |  "
                 "patch anomaly scores")
        plot_attention_map(path, seen(i), maps[i], title, scale)
        row["anomaly_map"] = str((final or out) / path.relative_to(out))


def scaled_heat(grid_map: np.ndarray, size: tuple[int, int], scale: tuple[float, float] | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """A patch-grid map (h, w) scaled to [0, 1], and that map upsampled (bicubic) to `size` (H, W): min-max on
    its own, or with `scale` (low, high) the same for every image, low to 0 and high to 1, clipped."""
    import cv2

    if scale is None:
        m = grid_map - grid_map.min()
        m = m / m.max() if m.max() > 0 else m
    else:
        m = ((grid_map - scale[0]) / max(scale[1] - scale[0], 1e-12)).clip(0, 1)
    heat = cv2.resize(m.astype(np.float32), (size[1], size[0]), interpolation=cv2.INTER_CUBIC).clip(0, 1)
    return m, heat


def overlay_image(image: np.ndarray, grid_map: np.ndarray, alpha: float = 0.5) -> np.ndarray:
    """The overlay panel of `attention_figure` as pixels: the input (H, W, 3) in [0, 1] blended with the map in
    the jet colour map at `alpha` -> uint8 (H, W, 3)."""
    from matplotlib import colormaps

    _, heat = scaled_heat(grid_map, image.shape[:2])
    colour = colormaps["jet"](heat)[..., :3]  # (H, W, 3) in [0, 1]
    return (255 * ((1 - alpha) * image[..., :3] + alpha * colour)).round().clip(0, 255).astype(np.uint8)


def attention_figure(image: np.ndarray, grid_map: np.ndarray, title: str,
                     scale: tuple[float, float] | None = None) -> Figure:
    """Input (H, W, C) in [0, 1] | patch-grid map (h, w) | map upsampled (bicubic) over the input, with a colour
    bar for the map's scale: the map is shifted and scaled to [0, 1] (its minimum to 0, its maximum to 1), so
    the colours rank patches within one image and are not comparable across images; with `scale` (low, high)
    every image shares one scale (anomaly maps: 0 to twice the threshold, the threshold the middle colour)."""
    from matplotlib.figure import Figure

    m, heat = scaled_heat(grid_map, image.shape[:2], scale)
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
    label = "relevance (min-max scaled)" if scale is None else f"score, {scale[0]:.3g} to {scale[1]:.3g}"
    fig.colorbar(im, ax=list(axes), fraction=0.025, pad=0.02, label=label)
    fig.suptitle(title, fontsize=9)
    return fig


def plot_few_shot(summary: list[dict], path: Path) -> None:
    """Top-1 against labelled images per class, one line per method with its spread over seeds as error bars;
    `summary`: vit.train.few_shot.summarize's rows (method, shots, mean, std)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 3.8))
    ax = fig.add_subplot()
    for method in dict.fromkeys(r["method"] for r in summary):
        pts = sorted((r["shots"], r["mean"], r["std"]) for r in summary if r["method"] == method and r["shots"] > 0)
        colour = None
        if pts:
            n, m, s = zip(*pts)
            line = ax.errorbar(n, [100 * v for v in m], yerr=[100 * v for v in s], marker="o", capsize=3,
                               label=method)
            colour = line.lines[0].get_color()
        for r in summary:  # --shots 0 (every image) has no place on the axis: a dashed level across it
            if r["method"] == method and r["shots"] == 0:
                ax.axhline(100 * r["mean"], linestyle="--", color=colour, label=f"{method}, all images")
    ax.set_xscale("log")
    ax.set_xlabel("labelled images per class")
    ax.set_ylabel("top-1 (%)")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path, dpi=100)


def plot_reconstructions(images, reconstructed, mask, patch: int, out_png: str | Path, mean, std) -> None:
    """MAE's picture (vit/train/tasks/mae.py): one row per image, masked / reconstructed / original (see
    reconstructions_figure); `images`, `reconstructed` normalised (B, C, H, W), `mask` (B, N) with 1 = hidden."""
    save_figure(reconstructions_figure(images, reconstructed, mask, patch, mean, std), Path(out_png), dpi=100)


def reconstructions_figure(images, reconstructed, mask, patch: int, mean, std) -> Figure:
    """The input with its hidden patches greyed out, the reconstruction (visible patches as given), the original."""
    from matplotlib.figure import Figure

    rows = len(images)
    fig = Figure(figsize=(6, 2 * rows))
    axes = np.atleast_2d(fig.subplots(rows, 3))
    h, w = images.shape[-2] // patch, images.shape[-1] // patch
    for i in range(rows):
        hidden = np.kron(mask[i].reshape(h, w).numpy(), np.ones((patch, patch)))[..., None] > 0  # (H, W, 1)
        original = to_display(images[i], mean, std)
        for ax, img, title in zip(axes[i], (np.where(hidden, 0.5, original), to_display(reconstructed[i], mean, std),
                                            original), ("masked", "reconstructed", "original")):
            ax.imshow(img, interpolation="nearest")
            ax.axis("off")
            if i == 0:
                ax.set_title(title, fontsize=10)
    return fig
