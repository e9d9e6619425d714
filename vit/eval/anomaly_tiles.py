"""Anomaly scores and maps of images larger than the model's input, by overlapping tiles (`anomaly.py score
--tile N`): a wide line-scan strip is read at its own scale instead of being squashed to the model's square, so a
defect a few pixels wide keeps its pixels.

Tiles of N x N pixels (N: the model's input size, or a size it takes) start every N / 2 pixels, the last flush with
the image's edge (vit.eval.segmentation.window_starts, the segmenter's sliding windows). A batch of tiles is scored
by the detector as any batch of images (PatchCore, AnomalyDINO, Dinomaly: `score(model, x) -> (scores, maps)`), so
memory is bounded by the tile batch, not the image. Each tile's patch map is brought to its N x N pixels
(bilinear, as the metrics upsample maps) and the overlaps averaged into one map of the image's H x W pixels; the
image's score is its worst tile's score (for PatchCore the highest patch anywhere, as on a whole image).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .segmentation import normalised, window_starts

__all__ = ["check_tile", "tile_boxes", "normalised", "TileFiles", "tiled_score"]


def check_tile(tile: int, height: int, width: int, what: str = "the image") -> None:
    """ValueError, one sentence, for a tile that does not fit inside the image."""
    if tile < 1 or tile > min(height, width):
        raise ValueError(f"--tile {tile} does not fit {what} of {width}x{height} pixels (a tile lies inside the image: "
                         f"at most its shorter side, {min(height, width)}); leave images smaller than the tile out, "
                         "or leave --tile out to score every image resized to the model's input.")


def tile_boxes(height: int, width: int, tile: int, stride: int | None = None) -> list[tuple[int, int]]:
    """(top, left) of every tile of an image, row by row (module docstring)."""
    stride = stride or max(1, tile // 2)
    return [(t, left) for t in window_starts(height, tile, stride) for left in window_starts(width, tile, stride)]


class TileFiles(torch.utils.data.Dataset):
    """Every tile of each readable image (read at its own scale, normalised) as one item (tile (3, N, N), 1,
    index), as vit.eval.inference.ImageFiles yields whole images: what `anomaly.py fit --tile` builds a bank or
    trains Dinomaly on. Unreadable files give no tile; an image a tile does not fit is one sentence."""

    naflex, collate = False, None

    def __init__(self, paths, tile: int, mean, std) -> None:
        from ..data.decode import BadImageError, decode_image

        self.tiles, self.shape = [], (3, tile, tile)
        for p in paths:
            try:
                image = decode_image(p)
            except (BadImageError, ValueError, OSError):
                continue
            check_tile(tile, *image.shape[:2], f"image {p}")
            x = normalised(image, mean, std)
            self.tiles += [x[:, t:t + tile, left:left + tile] for t, left in tile_boxes(*x.shape[1:], tile)]

    def __len__(self) -> int:
        return len(self.tiles)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        return self.tiles[i], 1, i


@torch.no_grad()
def tiled_score(detector, model, image: torch.Tensor, tile: int, batch_size: int = 32,
                stride: int | None = None) -> tuple[float, np.ndarray]:
    """(score, map (H, W) float64) of one normalised image (C, H, W) scored in tiles (module docstring)."""
    _, H, W = image.shape
    check_tile(tile, H, W)
    boxes = tile_boxes(H, W, tile, stride)
    total, count = torch.zeros(H, W, dtype=torch.float64), torch.zeros(H, W, dtype=torch.float64)
    worst = -float("inf")
    for i in range(0, len(boxes), batch_size):
        part = boxes[i:i + batch_size]
        crops = torch.stack([image[:, t:t + tile, left:left + tile] for t, left in part])
        scores, maps = detector.score(model, crops)  # (b,), (b, h, w) on the tile's patch grid
        up = F.interpolate(maps[:, None].double().cpu(), size=(tile, tile), mode="bilinear", align_corners=False)
        for (t, left), m in zip(part, up[:, 0]):
            total[t:t + tile, left:left + tile] += m
            count[t:t + tile, left:left + tile] += 1
        worst = max(worst, float(scores.max()))
    return worst, (total / count).numpy()
