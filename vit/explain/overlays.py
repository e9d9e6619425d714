"""Each prediction's picture: the attention-rollout overlay of an image over what the model saw, and the
anomaly heat map of an image scored against a PatchCore bank; the pictures predict.py --cam writes.

    write_cams(model, result.dataset, result.rows, result.good, cfg, Path("preds"))   # preds/cam/<i>_<name>.png
"""

from __future__ import annotations

from pathlib import Path

from ..data.naflex import as_picture
from ..eval.inference import ImageFiles, batch_of
from ..eval.plots import plot_anomaly_maps, plot_attention_map, to_display
from .rollout import attention_maps

__all__ = ["write_cams", "write_anomaly_maps"]


def write_cams(model, dataset: ImageFiles, rows: list[dict], good: list[int], cfg, out: Path, batch: int = 32,
               final: Path | None = None) -> None:
    """Attention rollout of each readable image (`good`: their indices in `dataset`, in the order of `rows`),
    drawn over what the model saw (a NaFlex image at its own aspect ratio, on its own grid), written into
    `out`/cam/; each row's `cam` names its picture as it will be in `final` (the folder `out` is moved to)."""
    for start in range(0, len(good), batch):
        chunk = good[start:start + batch]
        items = [dataset[i] for i in chunk]
        maps, _ = attention_maps(model, batch_of(dataset, items), "rollout")  # (B, h, w) or B maps (h_i, w_i)
        for j, (i, row) in enumerate(zip(chunk, rows[start:start + batch])):
            path = out / "cam" / f"{i:06d}_{Path(row['path']).stem}.png"
            title = f"{Path(row['path']).name}: {row['pred1_name']} ({100 * row['prob1']:.1f}%)  |  rollout"
            seen = to_display(as_picture(items[j][0], cfg.model.patch_size), cfg.aug.mean, cfg.aug.std)
            plot_attention_map(path, seen, maps[j].numpy(), title)
            row["cam"] = str((final or out) / path.relative_to(out))


def write_anomaly_maps(dataset: ImageFiles, rows: list[dict], good: list[int], maps, cfg, out: Path,
                       final: Path | None = None, threshold: float | None = None) -> None:
    """Each readable image's anomaly heat map (`maps`: the patch scores of every input, (h, w) each) drawn over what
    the model saw of it by vit.eval.plots.plot_anomaly_maps (0 to twice `threshold`), into `out`/cam/."""
    def seen(i: int):
        return to_display(as_picture(dataset[i][0], cfg.model.patch_size), cfg.aug.mean, cfg.aug.std)

    plot_anomaly_maps(seen, rows, good, maps, out, final, threshold)
