"""Dinomaly (Guo et al., CVPR 2025, "Dinomaly: The Less Is More Philosophy in Multi-Class Unsupervised Anomaly
Detection"): a frozen ViT encoder and a small decoder trained on good images to reconstruct its features; where
the reconstruction fails, the image is anomalous.

1. Encoder (sec. 3.1): the patch tokens of the middle blocks of any ViT `create_model` builds (`dinomaly_layers`:
   blocks 2 to 9 of 12, as the paper's ViT-B), frozen; their mean is the decoder's input.
2. Noisy bottleneck (sec. 3.2): an MLP with dropout on its input, hidden layer and output (0.2), so the decoder
   never sees the clean features it must rebuild and cannot learn the identity.
3. Linear-attention decoder (sec. 3.3): as many pre-norm Transformer blocks (this project's `Block`, LayerNorm eps
   1e-8) as encoder blocks read, with `vit.layers.LinearAttention`, which cannot focus on one token.
4. Loose reconstruction (sec. 3.4): the encoder's blocks and the decoder's (last first) averaged in two groups
   (first half, second half); each decoder group rebuilds its encoder group. Loss: the global cosine distance of
   each group (1 - cos of the whole (N * D) feature vectors of an image, batch mean), groups averaged, with
   hard mining: the gradient of the points (patches) whose own cosine distance is below the (1 - p) quantile is
   scaled by 0.1, p rising from 0 to 0.9 over the first tenth of training (the paper's first 1,000 of 10,000).
5. Map and score: per patch, 1 - cos(encoder group, decoder group), averaged over the groups, on the patch grid
   (B, h, w); the image score is the mean of its 1% highest patches (the paper: of the full-size map, smoothed).

The encoder reads patch tokens only (the Dinomaly code's `remove_class_token=True` variant). Saved as
dinomaly.safetensors (the bottleneck and decoder) beside patchcore.json (method "dinomaly"), never pickled.
"""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.linear_attention import LinearAttention
from ..models.encoder import Block
from ..utils.atomic import atomic_write_bytes, atomic_write_text
from .anomaly import score_files, top_mean
from .anomaly_settings import SETTINGS_FILE, check_threshold, read_settings
from .inference import ImageFiles

__all__ = ["DINOMALY_FILE", "load_detector", "find_detector", "dinomaly_layers", "NoisyBottleneck", "Dinomaly",
           "hard_mining_loss", "fit_dinomaly", "save_dinomaly", "load_dinomaly"]

DINOMALY_FILE = "dinomaly.safetensors"


def dinomaly_layers(depth: int) -> tuple[int, ...]:
    """The middle blocks the encoder reads: depth // 6 to depth - depth // 6 - 1 (ViT-B's 12: 2 to 9; ViT-L's 24:
    4 to 19, the paper's; a 4-block model: all four)."""
    cut = depth // 6
    return tuple(range(cut, depth - cut))


class NoisyBottleneck(nn.Module):
    """Dropout -> fc1 -> GELU -> dropout -> fc2 -> dropout: (B, N, D) -> (B, N, D)."""

    def __init__(self, dim: int, hidden: int, drop: float = 0.2) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(self.drop(x))))))


class Dinomaly(nn.Module):
    """The trained half of Dinomaly (bottleneck and decoder) for an encoder reading `layers`; `score` runs both."""

    def __init__(self, dim: int, num_heads: int, layers: tuple[int, ...], mlp_ratio: float = 4.0,
                 dropout: float = 0.2, top_share: float = 0.01, threshold: float | None = None) -> None:
        super().__init__()
        self.layers, self.dim, self.num_heads = tuple(int(i) for i in layers), dim, num_heads
        self.mlp_ratio, self.dropout, self.top_share, self.threshold = mlp_ratio, dropout, top_share, threshold
        n = len(self.layers)
        self.groups = (tuple(range(n)),) if n == 1 else (tuple(range(n // 2)), tuple(range(n // 2, n)))
        self.bottleneck = NoisyBottleneck(dim, int(dim * mlp_ratio), dropout)
        norm = partial(nn.LayerNorm, eps=1e-8)
        self.decoder = nn.ModuleList(Block(dim, num_heads, mlp_ratio, qkv_bias=True, norm_layer=norm,
                                           attn_layer=LinearAttention) for _ in range(n))
        for m in self.modules():  # the paper's initialisation: small weights, zero biases, unit norms
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.01, a=-0.02, b=0.02)
                nn.init.zeros_(m.bias)

    def encode(self, model, x: torch.Tensor) -> tuple[list[torch.Tensor], tuple[int, int]]:
        """Images (B, C, H, W) -> the frozen encoder's patch tokens of each block read, (B, N, D) each, and the grid."""
        if isinstance(x, dict):
            raise ValueError("Dinomaly scores square images only; use PatchCore or AnomalyDINO with NaFlex data.")
        with torch.no_grad():
            maps = model.forward_intermediates(x, indices=list(self.layers), output_fmt="NCHW",
                                               intermediates_only=True)
        return [m.flatten(2).transpose(1, 2).float() for m in maps], tuple(maps[0].shape[-2:])

    def forward(self, enc: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Encoder tokens (one (B, N, D) per block read) -> (encoder groups, decoder groups), (B, N, D) each."""
        x = self.bottleneck(torch.stack(enc).mean(0))  # fused: the mean of the blocks read
        dec = []
        for blk in self.decoder:
            x, _ = blk(x)
            dec.append(x)
        dec = dec[::-1]  # the last decoder block rebuilds the first encoder block
        fuse = lambda xs, g: torch.stack([xs[i] for i in g]).mean(0)  # noqa: E731
        return [fuse(enc, g) for g in self.groups], [fuse(dec, g) for g in self.groups]

    @staticmethod
    def anomaly_map(en: list[torch.Tensor], de: list[torch.Tensor]) -> torch.Tensor:
        """Groups (B, N, D) -> (B, N): 1 - cos per patch, averaged over the groups."""
        return torch.stack([1 - F.cosine_similarity(a, b, dim=-1) for a, b in zip(en, de)]).mean(0)

    @torch.no_grad()
    def score(self, model, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Images (B, C, H, W) -> (image scores (B,), patch maps (B, h, w)), on CPU."""
        self.eval()
        device = next(model.parameters()).device
        self.to(device)
        enc, (h, w) = self.encode(model, x.to(device))
        m = self.anomaly_map(*self(enc)).cpu()  # (B, N)
        return top_mean(m, self.top_share), m.reshape(len(m), h, w)

    def score_files(self, model, dataset: ImageFiles, batch_size: int = 32):
        return score_files(self, model, dataset, batch_size)


def hard_mining_loss(en: list[torch.Tensor], de: list[torch.Tensor], p: float, factor: float = 0.1) -> torch.Tensor:
    """Dinomaly's global cosine loss with hard mining: mean over groups of mean over images of 1 - cos(e, d) of the
    whole flattened (N * D) vectors; the value is that exactly, and in the backward pass the gradient reaching
    the decoder's points whose own 1 - cos is below the top (1 - p) share's smallest is scaled by `factor`."""
    total = 0.0
    for a, b in zip(en, de):  # (B, N, D)
        a = a.detach()
        with torch.no_grad():
            d = 1 - F.cosine_similarity(a, b, dim=-1)  # (B, N)
            k = max(1, int(d.numel() * (1 - p)))
            easy = (d < d.flatten().topk(k).values[-1])[..., None]  # (B, N, 1)
        b = torch.where(easy, factor * b + (1 - factor) * b.detach(), b)  # same value, gradient x factor
        total = total + (1 - F.cosine_similarity(a.flatten(1), b.flatten(1), dim=1)).mean()
    return total / len(en)


def _good_images(dataset: ImageFiles) -> torch.Tensor:
    xs = [x for x, ok, _ in (dataset[i] for i in range(len(dataset))) if ok]
    if not xs:
        raise ValueError("none of the good images could be read; pass a folder of readable images of good parts.")
    if getattr(dataset, "naflex", False):
        raise ValueError("Dinomaly trains on square images only; use PatchCore or AnomalyDINO with NaFlex data.")
    return torch.stack(xs)


def fit_dinomaly(model, dataset: ImageFiles, steps: int = 1000, batch_size: int = 16, lr: float = 2e-3,
                 seed: int = 0, layers: tuple[int, ...] | None = None, dropout: float = 0.2,
                 progress: bool = False) -> Dinomaly:
    """Train the bottleneck and decoder on the good images of `dataset` for `steps` batches (AdamW, weight decay
    1e-4, a 1% linear warm-up then a cosine to a tenth, gradient norm clipped at 0.1, as the paper's recipe)."""
    from tqdm import tqdm

    if steps < 1 or batch_size < 1:
        raise ValueError(f"Dinomaly trains for at least 1 step of at least 1 image, got {steps} and {batch_size}.")
    images = _good_images(dataset)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    layers = tuple(layers) if layers is not None else dinomaly_layers(len(model.blocks))
    heads = getattr(model.blocks[0].attn, "num_heads", 1)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        det = Dinomaly(model.embed_dim, heads, layers, dropout=dropout).to(next(model.parameters()).device)
        opt = torch.optim.AdamW(det.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=1e-4)
        warm = max(1, steps // 100)
        rate = lambda t: (t + 1) / warm if t < warm else 0.1 + 0.45 * (1 + math.cos(  # noqa: E731
            math.pi * (t - warm) / max(1, steps - warm)))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, rate)
        gen = torch.Generator().manual_seed(seed)
        det.train()
        bar = tqdm(range(steps), desc="dinomaly: training", unit="step", leave=False,
               disable=not progress)
        for t in bar:
            idx = torch.randint(len(images), (min(batch_size, len(images)),), generator=gen)
            enc, _ = det.encode(model, images[idx].to(next(det.parameters()).device))
            loss = hard_mining_loss(*det(enc), p=0.9 * min(1.0, t / max(1, steps // 10)))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(det.parameters(), 0.1)
            opt.step()
            sched.step()
            if t % 50 == 0:
                bar.set_postfix(loss=f"{loss.item():.4f}")
    return det.eval()


def save_dinomaly(folder: str | Path, det: Dinomaly, extra: dict | None = None) -> Path:
    """`folder`/dinomaly.safetensors (bottleneck and decoder) and patchcore.json (method "dinomaly", its shape,
    the threshold and `extra`), each atomically."""
    from safetensors.torch import save

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    check_threshold(det.threshold, "this Dinomaly", "choose it with vit.eval.anomaly_threshold on good images")
    atomic_write_bytes(folder / DINOMALY_FILE, save({k: v.contiguous() for k, v in det.state_dict().items()}))
    settings = {"method": "dinomaly", "layers": list(det.layers), "neighbourhood": 1, "normalize": False,
                "top_share": det.top_share, "threshold": det.threshold, "dim": det.dim, "num_heads": det.num_heads,
                "mlp_ratio": det.mlp_ratio, "dropout": det.dropout, **(extra or {})}
    atomic_write_text(folder / SETTINGS_FILE, json.dumps(settings, indent=1, allow_nan=False))
    return folder


def load_dinomaly(folder: str | Path) -> Dinomaly:
    """The Dinomaly `save_dinomaly` wrote into `folder`; another method's folder or a broken file: one sentence."""
    from safetensors.torch import load_file

    folder = Path(folder)
    redo = "fit it again with anomaly.py fit --method dinomaly"
    s = read_settings(folder / SETTINGS_FILE, redo)
    if s["method"] != "dinomaly":
        raise ValueError(f"{folder} holds a {s['method']} bank, not a Dinomaly model; score it as that method.")
    try:
        det = Dinomaly(int(s["dim"]), int(s["num_heads"]), tuple(s["layers"]), float(s["mlp_ratio"]),
                       float(s["dropout"]), s["top_share"], s["threshold"])
        det.load_state_dict(load_file(folder / DINOMALY_FILE))
    except Exception as e:  # missing keys, shapes, a truncated file: all mean the same to the user
        raise ValueError(f"{folder} does not hold a Dinomaly model ({str(e).splitlines()[0][:160]}); {redo}.") from None
    if not all(torch.isfinite(v).all() for v in det.state_dict().values()):
        raise ValueError(f"{folder / DINOMALY_FILE} holds NaN or infinite weights; {redo}.")
    return det.eval()


def load_detector(folder: str | Path):
    """What anomaly.py fit wrote into `folder`: a PatchCore / AnomalyDINO bank or a Dinomaly model (by its
    patchcore.json's method); a missing or broken folder is the loaders' one sentence."""
    from .anomaly import load_patchcore

    settings = Path(folder) / SETTINGS_FILE
    if settings.is_file() and read_settings(settings, "fit it again with anomaly.py fit")["method"] == "dinomaly":
        return load_dinomaly(folder)
    return load_patchcore(folder)


def find_detector(checkpoint: str | Path | None, name: str | None = None):
    """The detector anomaly.py fit saved into `checkpoint`/anomaly/ or anomaly/<name>/ (any method;
    vit.eval.anomaly_settings.detector_folder), or None when there is none."""
    from .anomaly_settings import check_whole_images, detector_folder

    folder = detector_folder(checkpoint, name)
    return None if folder is None else load_detector(check_whole_images(folder))
