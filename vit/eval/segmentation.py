"""Segmentation metrics and inference: the confusion over classes (pixels of the ignore index left out), and from it
per-class IoU, mIoU, Dice and pixel accuracy; the pixel AUROC of a class's probability; sliding-window logits for
images larger than the model's input, and one image's classes by them (`segment_image`: predict.py and the demo).

With C[t, p] the number of pixels of true class t predicted p:
    IoU_c = C[c, c] / (sum_p C[c, p] + sum_t C[t, c] - C[c, c])
    Dice_c = 2 C[c, c] / (sum_p C[c, p] + sum_t C[t, c])
    pixel accuracy = trace(C) / sum(C);  mIoU, mean Dice: over the classes that occur in the truth or the prediction
(a class seen in neither has no IoU, NaN, and does not count: mmseg's and torchmetrics' convention).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["segment_image", "image_logits", "confusion", "seg_scores", "pixel_auroc", "normalised", "window_starts",
           "sliding_logits", "predict_masks", "evaluate_segmentation", "flat_pixels", "naflex_budget"]

IGNORE_INDEX = 255


def confusion(pred: torch.Tensor, target: torch.Tensor, num_classes: int,
              ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """(C, C) int64 counts, rows the true class, columns the predicted; pixels whose target is `ignore_index`
    are left out. pred, target: integer tensors of one shape."""
    keep = target != ignore_index
    t, p = target[keep].long(), pred[keep].long()
    return torch.bincount(t * num_classes + p, minlength=num_classes ** 2).reshape(num_classes, num_classes).cpu()


def seg_scores(conf: torch.Tensor | np.ndarray) -> dict:
    """mIoU, per-class IoU, mean and per-class Dice, pixel accuracy (module docstring) of a confusion matrix."""
    c = np.asarray(conf, np.float64)
    tp, true, predicted = np.diag(c), c.sum(1), c.sum(0)
    union = true + predicted - tp
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, tp / union, np.nan)
        dice = np.where(true + predicted > 0, 2 * tp / (true + predicted), np.nan)
    total = c.sum()
    return {"miou": float(np.nanmean(iou)) if np.isfinite(iou).any() else float("nan"), "iou": iou.tolist(),
            "mdice": float(np.nanmean(dice)) if np.isfinite(dice).any() else float("nan"), "dice": dice.tolist(),
            "pixel_acc": float(tp.sum() / total) if total else float("nan"), "pixels": int(total)}


def pixel_auroc(scores: np.ndarray, positive: np.ndarray) -> float:
    """ROC AUC over pixels: the chance that a positive pixel scores above a negative one, ties half (Mann-Whitney
    U from average ranks)."""
    from scipy.stats import rankdata

    s, y = np.asarray(scores, np.float64).ravel(), np.asarray(positive, bool).ravel()
    n1, n0 = int(y.sum()), int((~y).sum())
    if not n1 or not n0:
        raise ValueError("a pixel AUROC needs both positive and negative pixels.")
    ranks = rankdata(s)
    return float((ranks[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def normalised(image: np.ndarray, mean, std) -> torch.Tensor:
    """An RGB uint8 (H, W, 3) image -> (3, H, W) float32, (x / 255 - mean) / std per channel."""
    m, s = torch.tensor(mean)[:, None, None], torch.tensor(std)[:, None, None]
    return (torch.from_numpy(np.array(image)).permute(2, 0, 1).float() / 255 - m) / s


def window_starts(size: int, window: int, stride: int) -> list[int]:
    """Where windows of `window` pixels start along a side of `size`: every `stride`, the last flush with the end."""
    if size <= window:
        return [0]
    starts = list(range(0, size - window + 1, stride))
    return starts + ([size - window] if starts[-1] != size - window else [])  # the last window touches the edge


@torch.no_grad()
def sliding_logits(model, x: torch.Tensor, window: int, stride: int | None = None,
                   num_classes: int | None = None) -> torch.Tensor:
    """Logits (B, C, H, W) of images larger than the model's input: windows of `window` pixels every `stride`
    (default: half a window), the last flush with the edge, overlapping logits averaged. A side shorter than the
    window is padded with zeros (the normalised mean) and cropped back."""
    B, _, H, W = x.shape
    stride = stride or max(1, window // 2)
    pad_h, pad_w = max(0, window - H), max(0, window - W)
    xp = F.pad(x, (0, pad_w, 0, pad_h))
    Hp, Wp = xp.shape[-2:]
    total, count = None, torch.zeros(1, 1, Hp, Wp, device=x.device)
    for top in window_starts(Hp, window, stride):
        for left in window_starts(Wp, window, stride):
            out = model(xp[:, :, top:top + window, left:left + window])  # (B, C, window, window)
            if total is None:
                total = torch.zeros(B, num_classes or out.shape[1], Hp, Wp, device=x.device)
            total[:, :, top:top + window, left:left + window] += out
            count[:, :, top:top + window, left:left + window] += 1
    return (total / count)[:, :, :H, :W]


def flat_pixels(logits: torch.Tensor | list[torch.Tensor], masks: torch.Tensor | list[torch.Tensor]) -> tuple[
        torch.Tensor, torch.Tensor]:
    """A NaFlex batch's per-image logits (C, h, w) and masks (H, W) -> every pixel in one (1, C, 1, N) and
    (1, 1, N), each image's logits resized (bilinear) to its mask first; a loss or confusion over them counts each
    pixel once, as over a batch of one size. Tensors (one size) pass through."""
    if torch.is_tensor(logits):
        return logits, masks
    flat, targets = [], []
    for lg, m in zip(logits, masks):
        if lg.shape[-2:] != m.shape[-2:]:
            lg = F.interpolate(lg[None], size=m.shape[-2:], mode="bilinear", align_corners=False)[0]
        flat.append(lg.flatten(1))
        targets.append(m.flatten())
    return torch.cat(flat, 1)[None, :, None], torch.cat(targets)[None, None]


def naflex_budget(cfg) -> tuple[int, int] | None:
    """(patch size, max_num_patches) of a NaFlex segmentation config, None for one input size."""
    nf = getattr(getattr(cfg, "data", None), "naflex", None)
    return None if nf is None else (cfg.model.patch_size, nf.max_num_patches)


@torch.no_grad()
def predict_masks(model, loader, num_classes: int, keep_probs: bool = False) -> dict:
    """Over (images, masks) batches of the input size (or NaFlex batches): the confusion, and with `keep_probs` the
    softmax probabilities (N, C, H, W) and masks (N, H, W) for pixel AUROC (scripts/seg_parts.py). Files of other
    sizes are scored by `evaluate_segmentation`."""
    model.eval()
    conf = torch.zeros(num_classes, num_classes, dtype=torch.int64)
    probs, masks = [], []
    for x, y in loader:
        logits, y = flat_pixels(model(x), y)  # NaFlex: every image at its own grid; a tensor batch passes through
        conf += confusion(logits.argmax(1), y, num_classes)
        if keep_probs:
            probs.append(logits.float().softmax(1).cpu())
            masks.append(y.cpu())
    out = {"confusion": conf}
    if keep_probs:
        out["probs"], out["masks"] = torch.cat(probs), torch.cat(masks)
    return out


def evaluate_segmentation(model, cfg, classes: list[str], split: str = "val", out_dir=None,
                          folder: str | None = None, log=None) -> dict:
    """evaluate.py's metrics of a segmentation checkpoint: mIoU, per-class IoU and Dice, pixel accuracy, the
    confusion over classes; with `out_dir`, metrics.json and per_class.csv. Scored: the config's `split` (data.root/
    <split>/ or <split>.csv: train, val, test, ...) or `folder` (images/ + masks/, or a CSV of pairs). Each image is
    segmented as predict.py segments it (`segment_image`: resized, in sliding windows or at its NaFlex grid) and
    compared with its mask file at the file's own size, as training's val evaluation compares them. An unreadable
    image is refused or, with data.on_bad_image=skip, left out and named in `skipped`. `log`: told what is scored
    before it starts."""
    import json

    from ..data.decode import BadImageError
    from ..data.segmentation import DataError, SegmentationDataset, find_pairs, split_source
    from ..utils.atomic import atomic_write_csv, atomic_write_text

    source = Path(folder) if folder is not None else split_source(Path(cfg.data.root), split)  # or one sentence
    if not source.exists():
        raise DataError(f"--data-dir: {source} does not exist; give a folder with images/ and masks/ or a CSV of "
                        "pairs.")
    ds = SegmentationDataset(find_pairs(source, cfg.seg.missing_masks), classes, transform=None)
    if log is not None:
        log(f"scoring {len(ds)} images of {source} as predict.py segments them, against the mask files at their "
            "own size")
    mean, std, n = cfg.aug.mean or [0.5] * 3, cfg.aug.std or [0.5] * 3, len(classes)
    conf, skipped = torch.zeros(n, n, dtype=torch.int64), []
    model.eval()
    with torch.no_grad():
        for i in range(len(ds)):
            try:
                image, mask = ds.load(i)
            except BadImageError as e:  # as training's check: refused, or left out and named
                if cfg.data.on_bad_image != "skip":
                    raise DataError(f"{e}; remove it or set --data.on_bad_image=skip.") from None
                skipped.append(str(e))
                continue
            pred = segment_image(model, image, cfg.model.img_size, mean, std, cfg.seg.window, naflex_budget(cfg))
            conf += confusion(pred, torch.from_numpy(mask).long(), n)
    s = seg_scores(conf)
    metrics = dict(miou=s["miou"], mdice=s["mdice"], pixel_acc=s["pixel_acc"], pixels=s["pixels"],
                   images=len(ds) - len(skipped), skipped=skipped, classes=classes, iou=dict(zip(classes, s["iou"])),
                   dice=dict(zip(classes, s["dice"])), confusion=conf.tolist(),
                   split=split if folder is None else None, source=str(source))
    if out_dir is not None:
        out = Path(out_dir)
        atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=1))
        rows = [{"class": c, "iou": i, "dice": d} for c, i, d in zip(classes, s["iou"], s["dice"])]
        atomic_write_csv(out / "per_class.csv", ["class", "iou", "dice"], rows)
    return metrics


@torch.no_grad()
def image_logits(model, x: torch.Tensor, img_size: int, window: int | None = None) -> torch.Tensor:
    """(1, C, H, W) logits of one normalised image (1, 3, H, W) at its own size, as predict.py reads it: in
    sliding windows when a side is longer than the input, else resized to the input and the logits back."""
    H, W = x.shape[-2:]
    if max(H, W) > img_size:
        return sliding_logits(model, x, window or img_size)
    small = F.interpolate(x, size=(img_size, img_size), mode="bilinear", align_corners=False)
    return F.interpolate(model(small), size=(H, W), mode="bilinear", align_corners=False)


@torch.no_grad()
def segment_image(model, image: np.ndarray, img_size: int, mean, std, window: int | None = None,
                  naflex: tuple[int, int] | None = None) -> np.ndarray:
    """(H, W) int64 classes of an RGB uint8 (H, W, 3) image (module docstring: resize, or sliding windows).
    `naflex` (patch size, max_num_patches): a NaFlex model reads the image whole at its own aspect ratio, resized
    to the largest grid the budget allows, and its logits are resized back."""
    x = normalised(image, mean, std)[None]  # (1, 3, H, W)
    if naflex is None:
        return image_logits(model, x, img_size, window).argmax(1)[0]
    from ..data.naflex import collate_naflex, patchify
    from ..data.segmentation import fit_to_budget

    small = torch.from_numpy(fit_to_budget(x[0].permute(1, 2, 0).numpy(), *naflex)).permute(2, 0, 1)
    logits = model(collate_naflex([(patchify(small.contiguous(), naflex[0]), 0)])[0])[0][None]
    return F.interpolate(logits, size=image.shape[:2], mode="bilinear", align_corners=False).argmax(1)[0]
