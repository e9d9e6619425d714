"""Anomaly metrics as the field reports them (MVTec AD, Bergmann et al., 2019/2021; anomalib's `AUROC`, `AUPRO`):

- image AUROC: the chance that a defective image scores above a good one, ties counted half (Mann-Whitney U);
- pixel AUROC: the same over every pixel of every test image, defect-mask pixels positive, the maps upsampled
  to the masks' size;
- AUPRO to 30% FPR: for each threshold t, the per-region overlap PRO(t) = mean over the connected regions r of
  the masks (8-connected) of |{p in r: s_p >= t}| / |r|, against the false-positive rate FPR(t) = the share of
  pixels outside every mask (good images included) at or above t; the area under PRO(FPR) for FPR in [0, 0.3]
  (trapezoids, the curve cut at 0.3 by linear interpolation), divided by 0.3, so 1 is perfect.
All in float64 from the exact step curves (every distinct score a threshold), not from a grid of thresholds.
"""

from __future__ import annotations

import numpy as np

__all__ = ["auroc", "pixel_auroc", "aupro", "pro_curve", "upsample_maps", "region_labels"]


def auroc(scores, positive) -> float:
    """ROC AUC by ranks: (sum of the positives' ranks - n1 (n1 + 1) / 2) / (n1 n0), tied scores sharing their mean
    rank; O(n log n), so it serves pixels as well as images."""
    from scipy.stats import rankdata

    s, y = np.asarray(scores, np.float64).ravel(), np.asarray(positive, bool).ravel()
    if y.all() or not y.any():
        raise ValueError("AUROC needs both good and defective images (or pixels).")
    ranks = rankdata(s)  # average ranks on ties
    n1, n0 = int(y.sum()), int((~y).sum())
    return float((ranks[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def upsample_maps(maps, size: tuple[int, int]) -> np.ndarray:
    """Patch maps (N, h, w) -> (N, H, W) by bilinear interpolation (half-pixel centres, as anomalib's
    F.interpolate(mode="bilinear") of its patch maps)."""
    import torch
    import torch.nn.functional as F

    m = torch.as_tensor(np.asarray(maps, np.float64))[:, None]
    return F.interpolate(m, size=size, mode="bilinear", align_corners=False)[:, 0].numpy()


def pixel_auroc(maps: np.ndarray, masks: np.ndarray) -> float:
    """Pixel-level ROC AUC of maps (N, H, W) against boolean masks of the same shape."""
    return auroc(maps, masks)


def region_labels(masks: np.ndarray) -> np.ndarray:
    """(N, H, W) bool -> int labels, each 8-connected defect region of each image its own number 1..R, 0 outside."""
    from scipy.ndimage import label

    out, offset = np.zeros(masks.shape, np.int64), 0
    for i, m in enumerate(np.asarray(masks, bool)):
        lab, n = label(m, structure=np.ones((3, 3), int))
        out[i] = np.where(lab > 0, lab + offset, 0)
        offset += n
    return out


def pro_curve(maps: np.ndarray, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(FPR, PRO) at every distinct score as threshold, from the highest down, starting at (0, 0). Each pixel
    weighs 1 / N_normal in FPR when outside the masks, 1 / (R |r|) in PRO when in region r: sorted by score, the
    cumulative sums are the curves, read at the last pixel of each run of equal scores."""
    s = np.asarray(maps, np.float64).ravel()
    lab = region_labels(masks).ravel()
    R = int(lab.max())
    if R == 0 or (lab > 0).all():
        raise ValueError("AUPRO needs defect regions in the masks and pixels outside them.")
    sizes = np.bincount(lab, minlength=R + 1).astype(np.float64)
    normal = lab == 0
    w_fpr = normal / normal.sum()
    w_pro = np.where(normal, 0.0, 1.0 / (R * sizes[lab]))
    order = np.argsort(-s, kind="stable")
    fpr, pro = np.cumsum(w_fpr[order]), np.cumsum(w_pro[order])
    s_sorted = s[order]
    last = np.r_[s_sorted[1:] != s_sorted[:-1], True]  # the end of each run of tied scores
    return np.r_[0.0, fpr[last]], np.r_[0.0, pro[last]]


def aupro(maps: np.ndarray, masks: np.ndarray, max_fpr: float = 0.3) -> float:
    """Area under the PRO curve for FPR in [0, max_fpr], divided by max_fpr (maps and masks (N, H, W))."""
    if not 0 < max_fpr <= 1:
        raise ValueError(f"the FPR limit must be in (0, 1], got {max_fpr}.")
    fpr, pro = pro_curve(maps, masks)
    keep = fpr <= max_fpr
    x, y = fpr[keep], pro[keep]
    j = int(keep.sum())  # the first point beyond max_fpr, if any: cut the segment to it at max_fpr
    if j < len(fpr) and x[-1] < max_fpr:
        t = (max_fpr - fpr[j - 1]) / (fpr[j] - fpr[j - 1])
        x, y = np.r_[x, max_fpr], np.r_[y, pro[j - 1] + t * (pro[j] - pro[j - 1])]
    return float(np.trapezoid(y, x) / max_fpr)
