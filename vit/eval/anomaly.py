"""Anomaly detection from good parts only: PatchCore (Roth et al., 2022, "Towards Total Recall in Industrial
Anomaly Detection") on a ViT's intermediate patch tokens.

1. Patch features (sec. 3.1): the tokens of a few middle blocks (`forward_intermediates`, (B, D, h, w) each),
   each averaged over its 3x3 neighbourhood (local context, eq. 2; zeros outside the grid, as PatchCore's and
   anomalib's AvgPool2d(3, 1, 1)), concatenated along channels: one (len(layers) * D)-vector per patch. The grid
   matters: on 8x8 patches (a 64 px image) 3x3 covers a seventh of the image and dilutes a one-patch defect
   ninefold; PatchCore's grid is 28x28, and a 16x16 grid already works (docs/few-labels.md measures both).
2. Memory bank (sec. 3.2): the patch features of the good training images, subsampled by greedy k-center
   coreset selection on a random projection (Johnson-Lindenstrauss) of them: start at a random patch, then add the
   patch farthest from everything chosen, until the bank has `ratio` of them (Alg. 1).
3. Score (sec. 3.3): a patch's score is the Euclidean distance to its nearest bank feature; an image's score is
   its worst patch's, s = max_p min_m ||f_p - m||_2; the (h, w) patch scores are its heat map.

AnomalyDINO (Damm et al., 2024, "AnomalyDINO: Boosting Patch-based Few-shot Anomaly Detection with DINOv2") is
the same nearest-neighbour search made training-free and few-shot: every patch of a handful of good images in the
bank (no coreset, no neighbourhood averaging), cosine distance 1 - cos(f_p, m) on L2-normalised features, and the
image score the mean of its 1% most anomalous patches (`METHODS`: the settings each name stands for).

The threshold comes from validation images (vit.eval.anomaly_threshold); the metrics are vit.eval.anomaly_metrics.
Bank and threshold are saved as plain arrays (safetensors + JSON), never pickled.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..layers.naflex import grid_sizes
from ..utils.atomic import atomic_write_bytes, atomic_write_text
from .anomaly_settings import (
    ANOMALY_DIR,
    SETTINGS_FILE,
    check_threshold,
    check_whole_images,
    detector_folder,
    read_settings,
)
from .inference import ImageFiles, batch_of

__all__ = ["middle_layers", "backbone_layers", "feature_grid", "patch_features", "PatchFeatures", "random_projection",
           "k_center_greedy", "coreset",
           "nearest_distance", "PatchCore", "fit_patchcore", "save_patchcore", "load_patchcore", "find_patchcore",
           "top_mean", "score_files", "BANK_FILE", "ANOMALY_DIR", "METHODS"]

BANK_FILE = "bank.safetensors"  # beside SETTINGS_FILE, patchcore.json (vit.eval.anomaly_settings)
# the nearest-neighbour methods by name: fit_patchcore's keywords for each (Dinomaly, trained, is vit.eval.dinomaly)
METHODS = {"patchcore": dict(ratio=0.1, neighbourhood=3, normalize=False, top_share=0.0),
           "anomalydino": dict(ratio=1.0, neighbourhood=1, normalize=True, top_share=0.01)}


def backbone_layers(model) -> tuple[int, ...]:
    """The blocks a detector reads by default: a ViT's `middle_layers`, a CNN's two levels before the last
    (vit.models.cnn_backbone: a ResNet's layer2 and layer3)."""
    default = getattr(model, "default_layers", None)
    return default() if default is not None else middle_layers(len(model.blocks))


def feature_grid(model, size: tuple[int, int], layers: tuple[int, ...]) -> tuple[int, int]:
    """The (h, w) grid of the patch features of `layers` for an image of `size` pixels: a ViT's patch grid, a CNN's
    first level's."""
    return model.grid_size(size, layers[0]) if hasattr(model, "default_layers") else model.grid_size(size)


def middle_layers(depth: int) -> tuple[int, ...]:
    """The two blocks around the middle (PatchCore reads a ResNet's layer2 and layer3: mid-level, not the
    classifier's last, features); one for a 1- or 2-block model."""
    return tuple(sorted({max(0, depth // 2 - 1), depth // 2 if depth > 1 else 0}))


def _pooled(maps: list[torch.Tensor], k: int) -> torch.Tensor:
    """Per-layer maps (B, D, h, w) -> each patch's k x k neighbourhood summed and divided by k*k, zeros outside the
    grid (PatchCore's and anomalib's AvgPool2d(k, 1, k // 2)): an edge patch is shrunk toward 0, not averaged over
    fewer (noisier) neighbours, which on a small grid would put good images' worst patch on the border. The layers
    concatenated along channels -> (B, h*w, L*D)."""
    maps = [F.avg_pool2d(m.float(), k, stride=1, padding=k // 2, count_include_pad=True) for m in maps]
    grid = maps[0].shape[-2:]  # a CNN's deeper stages are coarser: brought to the first's grid (PatchCore, anomalib)
    maps = [m if m.shape[-2:] == grid else F.interpolate(m, size=grid, mode="bilinear") for m in maps]
    return torch.cat(maps, dim=1).flatten(2).transpose(1, 2)


@torch.no_grad()
def patch_features(model, x: torch.Tensor | dict, layers: tuple[int, ...], neighbourhood: int = 3,
                   normalize: bool = False) -> torch.Tensor | list[torch.Tensor]:
    """Images (B, C, H, W) -> patch features averaged over their `neighbourhood` x `neighbourhood` neighbours
    (odd; 1: none), (B, h*w, len(layers) * D), L2-normalised when `normalize` (AnomalyDINO's cosine distance).
    A NaFlex batch (a dict, vit.layers.naflex: each image at its own aspect ratio) -> a list of B
    (h_i*w_i, len(layers) * D), each image's neighbourhoods on its own grid."""
    if neighbourhood < 1 or neighbourhood % 2 == 0:
        raise ValueError(f"the neighbourhood must be an odd number of patches (3, or 1 for none), got {neighbourhood}.")
    maps = model.forward_intermediates(x, indices=list(layers), output_fmt="NCHW", intermediates_only=True)
    unit = (lambda f: F.normalize(f, dim=-1)) if normalize else (lambda f: f)  # noqa: E731
    if isinstance(x, dict):  # per layer a list of the B images' own grids (D, h_i, w_i)
        return [unit(_pooled([m[None] for m in image], neighbourhood)[0]) for image in zip(*maps)]
    return unit(_pooled(maps, neighbourhood))  # (B, h*w, L*D)


class PatchFeatures(torch.nn.Module):
    """`patch_features` as a module: images (B, C, H, W) -> (B, h*w, F), what an exporter traces (the ONNX
    feature model of vit/deploy/export.py's `export_patchcore`)."""

    def __init__(self, model, layers: tuple[int, ...], neighbourhood: int = 3, normalize: bool = False) -> None:
        super().__init__()
        self.model, self.layers, self.neighbourhood, self.normalize = model, tuple(layers), neighbourhood, normalize

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return patch_features(self.model, x, self.layers, self.neighbourhood, self.normalize)


def random_projection(x: torch.Tensor, dim: int, seed: int = 0) -> torch.Tensor:
    """(N, D) -> (N, dim) through a seeded Gaussian matrix scaled by 1/sqrt(dim) (distances kept in expectation)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(x.shape[1], dim, generator=g, dtype=torch.float64) / dim**0.5
    return (x.double() @ w.to(x.device)).to(x.dtype)


def k_center_greedy(z: torch.Tensor, n: int, start: int = 0) -> torch.Tensor:
    """Indices of `n` rows of z (N, D) chosen greedily: `start`, then each time the row whose distance to its
    nearest chosen row is largest (the first such row on a tie). O(N n) time, O(N) memory."""
    if n < 1 or not len(z):
        raise ValueError(f"k-center greedy chooses at least 1 of at least 1 rows, asked for {n} of {len(z)}.")
    n = min(n, len(z))
    chosen = torch.empty(n, dtype=torch.long)
    chosen[0] = start
    # cdist by differences: exact, and it streams z once, without the (N, D) temporary of (z - c).norm (4x faster)
    dist = lambda c: torch.cdist(z, z[c][None], compute_mode="donot_use_mm_for_euclid_dist")[:, 0]  # noqa: E731
    nearest = dist(start)  # (N,) distance of each row to its nearest chosen row
    for i in range(1, n):
        chosen[i] = int(nearest.argmax())
        nearest = torch.minimum(nearest, dist(int(chosen[i])))
    return chosen


def coreset(features: torch.Tensor, n: int, projection_dim: int = 128, seed: int = 0) -> torch.Tensor:
    """PatchCore's subsampling: k-center greedy on a random projection of `features` (N, D) (kept as they are
    when D <= projection_dim), started at a seeded random row. -> indices (n,)."""
    z = random_projection(features, projection_dim, seed) if features.shape[1] > projection_dim else features
    start = int(torch.randint(len(features), (1,), generator=torch.Generator().manual_seed(seed)))
    return k_center_greedy(z, n, start)


def nearest_distance(queries: torch.Tensor, bank: torch.Tensor, chunk: int = 2048, candidates: int = 8
                     ) -> torch.Tensor:
    """Euclidean distance of each query (M, D) to its nearest bank row (K, D) -> (M,). Two passes: one matrix
    product ranks the bank rows for each query by |m|^2 - 2 q.m (most of the cost, at GEMM speed), then the
    `candidates` best-ranked rows are measured exactly, by differences. Both sides are first centred on the
    bank's mean (distances do not change): the expansion's cancellation error grows with |q|^2, and a ViT's
    features sit far from the origin. It only ranks; a true nearest row ranked below `candidates` others would
    be within that error of each of them, so the exact minimum over the candidates differs from the true one by
    no more than it."""
    if not len(bank) or candidates < 1 or chunk < 1:
        raise ValueError(f"nearest distances need a bank of at least 1 row (it has {len(bank)}) and at least 1 "
                         f"candidate and query per chunk (got {candidates} and {chunk}).")
    c = min(candidates, len(bank))
    mean = bank.mean(0)
    centred = bank - mean
    b2 = (centred * centred).sum(1)  # (K,)
    out = []
    for i in range(0, len(queries), chunk):
        q = queries[i:i + chunk]
        rank = torch.addmm(b2[None], q - mean, centred.T, alpha=-2.0)  # (m, K); |q|^2 is the same along a row
        idx = rank.topk(c, dim=1, largest=False, sorted=False).indices  # (m, c)
        out.append((q[:, None, :] - bank[idx]).norm(dim=-1).amin(dim=1))
    return torch.cat(out) if out else queries.new_zeros(0)


def top_mean(patch: torch.Tensor, share: float) -> torch.Tensor:
    """(..., P) patch scores -> (...,) the mean of the ceil(share * P) highest (at least 1; share 0: the max)."""
    k = max(1, math.ceil(share * patch.shape[-1] - 1e-9))
    return patch.topk(k, dim=-1).values.mean(-1)


class PatchCore:
    """A memory bank of good patch features (K, F) for one backbone, the blocks it reads and a threshold; with
    `normalize` the features are unit vectors and a patch's score is the cosine distance d^2 / 2 = 1 - cos
    (AnomalyDINO), and an image's score is the mean of its `top_share` highest patches (0: the highest)."""

    def __init__(self, bank: torch.Tensor, layers: tuple[int, ...], threshold: float | None = None,
                 neighbourhood: int = 3, normalize: bool = False, top_share: float = 0.0,
                 method: str = "patchcore") -> None:
        self.bank, self.layers, self.threshold = bank.float(), tuple(int(i) for i in layers), threshold
        self.neighbourhood, self.normalize, self.top_share = int(neighbourhood), bool(normalize), float(top_share)
        self.method = method

    @torch.no_grad()
    def score(self, model, x: torch.Tensor | dict) -> tuple[torch.Tensor, torch.Tensor | list[torch.Tensor]]:
        """Images (B, C, H, W) -> (image scores (B,), patch score maps (B, h, w)); a NaFlex batch (a dict) ->
        (scores (B,), a list of B maps (h_i, w_i), each on its image's own grid)."""
        device = next(model.parameters()).device  # the model may sit on an accelerator; results come back on CPU
        x = {k: v.to(device) for k, v in x.items()} if isinstance(x, dict) else x.to(device)
        feats = patch_features(model, x, self.layers, self.neighbourhood, self.normalize)  # (B, h*w, F) or list
        flat = torch.cat(list(feats)) if isinstance(feats, list) else feats.flatten(0, 1)
        if flat.shape[1] != self.bank.shape[1]:
            raise ValueError(f"the bank holds {self.bank.shape[1]}-vectors but blocks {list(self.layers)} of this "
                             f"model give {flat.shape[1]}; it was built with another model: run anomaly.py fit with "
                             "this one.")
        patch = nearest_distance(flat, self.bank.to(device)).cpu()
        patch = patch.square() / 2 if self.normalize else patch  # unit vectors: |f - m|^2 / 2 = 1 - cos(f, m)
        if isinstance(feats, list):
            grids = grid_sizes(x["patch_coord"], x["patch_valid"]).tolist()
            maps = [p.reshape(h, w) for p, (h, w) in zip(patch.split([len(f) for f in feats]), grids)]
            return torch.stack([top_mean(m.flatten(), self.top_share) for m in maps]), maps
        B, P = feats.shape[:2]
        patch = patch.reshape(B, P)
        h, w = feature_grid(model, tuple(x.shape[-2:]), self.layers)
        return top_mean(patch, self.top_share), patch.reshape(B, h, w)

    def score_files(self, model, dataset: ImageFiles, batch_size: int = 32) -> tuple[np.ndarray, np.ndarray | list,
                                                                                      np.ndarray]:
        return score_files(self, model, dataset, batch_size)


def score_files(detector, model, dataset: ImageFiles, batch_size: int = 32) -> tuple[np.ndarray, np.ndarray | list,
                                                                                      np.ndarray]:
    """(scores (N,), maps (N, h, w), readable (N,) bool) of every file of `dataset`, in order, by any detector
    with `score(model, x) -> (scores, maps)` (PatchCore, vit.eval.dinomaly.Dinomaly); an unreadable file scores
    nan. With a NaFlex pipeline the maps are a list of N (h_i, w_i) arrays."""
    scores, maps, ok = [], [], []
    model.eval()
    for start in range(0, len(dataset), batch_size):
        items = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        s, m = detector.score(model, batch_of(dataset, items))
        good = torch.tensor([bool(it[1]) for it in items])
        scores.append(torch.where(good, s, torch.nan))
        maps += [g.numpy() for g in m] if isinstance(m, list) else [m]
        ok.append(good)
    maps = maps if getattr(dataset, "naflex", False) else torch.cat(maps).numpy()
    return torch.cat(scores).numpy(), maps, torch.cat(ok).numpy()


@torch.no_grad()
def fit_patchcore(model, dataset: ImageFiles, layers: tuple[int, ...] | None = None, ratio: float = 0.1,
                  batch_size: int = 32, seed: int = 0, projection_dim: int = 128, neighbourhood: int = 3,
                  max_bank: int | None = None, normalize: bool = False, top_share: float = 0.0,
                  method: str = "patchcore", progress: bool = False) -> PatchCore:
    """The bank of the good images in `dataset`: all their patch features, subsampled to `ratio` of them by the
    greedy coreset (at least one, at most `max_bank`). `layers`: the blocks read (default: `middle_layers`);
    `normalize`, `top_share`: see PatchCore (`METHODS` holds each method's settings); `progress`: a tqdm bar
    over the batches. Each image is read once and its features kept, (N * h*w, F) in memory; the coreset costs
    N * h*w * K distances for a bank of K, so at a fixed ratio it grows as N^2 and under `max_bank` linearly."""
    from tqdm import tqdm

    if not 0 < ratio <= 1:
        raise ValueError(f"the coreset ratio must be in (0, 1], got {ratio}; 0.1 keeps a tenth of the patches.")
    if max_bank is not None and max_bank < 1:
        raise ValueError(f"the bank's largest size must be at least 1 patch feature, got {max_bank}.")
    if not 0 <= top_share <= 1:
        raise ValueError(f"the share of patches an image's score averages must be in [0, 1], got {top_share}.")
    model.eval()
    layers = tuple(layers) if layers is not None else backbone_layers(model)
    feats = []
    for start in tqdm(range(0, len(dataset), batch_size), desc=f"{method}: good images", unit="batch", leave=False,
                      disable=not progress):
        items = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        items = [it for it in items if it[1]]  # unreadable images teach nothing
        if items:
            f = patch_features(model, batch_of(dataset, items), layers, neighbourhood, normalize)
            feats.append(torch.cat(f) if isinstance(f, list) else f.flatten(0, 1))  # (sum of h*w, F)
    if not feats:
        raise ValueError("none of the good images could be read; pass a folder of readable images of good parts.")
    feats = torch.cat(feats)  # (N * h*w, F)
    n = max(1, int(round(ratio * len(feats))))
    n = n if max_bank is None else min(n, max_bank)
    keep = coreset(feats, n, projection_dim, seed) if n < len(feats) else None
    return PatchCore(feats if keep is None else feats[keep], layers, None, neighbourhood, normalize, top_share, method)


def save_patchcore(folder: str | Path, pc: PatchCore, extra: dict | None = None) -> Path:
    """Write `folder`/bank.safetensors (the bank, float32) and patchcore.json (layers, threshold, and `extra`),
    each atomically. -> the folder."""
    from safetensors.torch import save

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(folder / BANK_FILE, save({"bank": pc.bank.contiguous()}))
    settings = {"method": pc.method, "layers": list(pc.layers), "neighbourhood": pc.neighbourhood,
                "normalize": pc.normalize, "top_share": pc.top_share, "threshold": pc.threshold,
                "bank_size": len(pc.bank), **(extra or {})}
    check_threshold(pc.threshold, "this PatchCore", "choose it with choose_threshold on good images")
    atomic_write_text(folder / SETTINGS_FILE, json.dumps(settings, indent=1, allow_nan=False))
    return folder


def load_patchcore(folder: str | Path) -> PatchCore:
    """The PatchCore `save_patchcore` wrote into `folder`; a missing or foreign file: one sentence."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / SETTINGS_FILE).is_file():
        raise FileNotFoundError(f"{folder} has no {BANK_FILE} and {SETTINGS_FILE}; build them with anomaly.py fit.")
    redo = "rebuild it with anomaly.py fit"
    settings = read_settings(folder / SETTINGS_FILE, redo)  # the checks predict.py --onnx's reader makes too
    if settings["method"] not in METHODS:
        raise ValueError(f"{folder} holds a {settings['method']} model, not a nearest-neighbour bank "
                         f"({' or '.join(METHODS)}); score it with anomaly.py score, or fit a bank into another "
                         "folder.")
    try:
        bank = load_file(folder / BANK_FILE)["bank"]
    except (SafetensorError, KeyError, OSError, ValueError) as e:
        raise ValueError(f"{folder} does not hold a PatchCore bank ({e}); {redo}.") from None
    if bank.ndim != 2 or not len(bank) or not bank.is_floating_point() or not torch.isfinite(bank).all():
        raise ValueError(f"{folder / BANK_FILE} is not a finite, floating-point (K, F) bank of at least 1 row; "
                         "rebuild it with anomaly.py fit.")
    return PatchCore(bank, tuple(settings["layers"]), settings["threshold"], settings["neighbourhood"],
                     settings["normalize"], settings["top_share"], settings["method"])


def find_patchcore(checkpoint: str | Path | None, name: str | None = None) -> PatchCore | None:
    """The PatchCore that anomaly.py fit saved into `checkpoint`/anomaly/ (or anomaly/<name>/, `detector_folder`),
    or None when there is none (a plain classifier checkpoint); a folder that is there but broken is
    load_patchcore's one sentence."""
    folder = detector_folder(checkpoint, name)
    return None if folder is None else load_patchcore(check_whole_images(folder))
