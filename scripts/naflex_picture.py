"""The picture of docs/naflex.md: a wide inspection strip as NaFlex sees it, against a square resize.

    python scripts/naflex_picture.py --out docs/naflex.png      # a few seconds, ~75 KB

Top: a 4:1 line-scan strip (four generated parts, a scratch in the last one: vit.data.synthetic.inspection_part)
cut into its 4 x 16 grid of 16 px patches by vit.layers.patchify, each patch's (row, column) its patch_coord; beside
it, the same strip squashed to a square, as a fixed-size ViT would take it. Bottom: a batch of three images of
different aspect ratios under a 64-patch budget (4:1, 1:1, 1:3) as `patch_valid` rows, and the attention mask
that vit.layers.key_padding_mask makes of the square image's row ([CLS] and valid patches are keys, padding never).
"""

from __future__ import annotations

import argparse
from pathlib import Path

P = 16  # patch size in pixels


def strip(seed: int = 0):
    """A (64, 256, 3) uint8 strip of four parts side by side, a scratch in the last one."""
    import numpy as np

    from vit.data.synthetic import inspection_part

    rng = np.random.default_rng(seed)
    parts = [inspection_part(rng, 64, "brushed", "scratch" if i == 3 else None)[0] for i in range(4)]
    return np.concatenate(parts, axis=1)


def naflex_batch(image, budget: int = 64):
    """The strip (4 x 16 patches), a 7 x 7 square and a 12 x 4 tall image in one NaFlex batch of `budget` patches."""
    import torch

    from vit.layers import patchify

    x = torch.from_numpy(image).permute(2, 0, 1)[None].float() / 255  # (1, 3, 64, 256)
    images = [x, torch.rand(1, 3, 7 * P, 7 * P), torch.rand(1, 3, 12 * P, 4 * P)]
    rows = [patchify(im, (P, P)) for im in images]
    out = {k: torch.zeros(len(rows), budget, *v.shape[2:], dtype=v.dtype) for k, v in rows[0].items()}
    for b, r in enumerate(rows):
        n = r["patches"].shape[1]
        for k in out:
            out[k][b, :n] = r[k][0]
    return out


def figure(image, batch):
    """The two-row figure (matplotlib Figure)."""
    import numpy as np
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from vit.layers import key_padding_mask

    fig = Figure(figsize=(9, 5.2))
    top = fig.add_gridspec(2, 4, height_ratios=[1, 1.25], hspace=0.45, wspace=0.35)
    ax = fig.add_subplot(top[0, :3])
    ax.imshow(image)
    h, w = image.shape[0] // P, image.shape[1] // P
    for r in range(1, h):
        ax.axhline(r * P - 0.5, color="yellow", lw=0.6)
    for c in range(1, w):
        ax.axvline(c * P - 0.5, color="yellow", lw=0.6)
    for r, c in ((0, 0), (0, w - 1), (h - 1, 0), (h - 1, w - 1), (1, 13)):
        ax.text(c * P + P / 2, r * P + P / 2, f"{r},{c}", color="white", fontsize=6, ha="center", va="center")
    ax.set_title(f"NaFlex: a 4:1 strip at its own aspect ratio, {h} x {w} patches of {P} px (row, column)",
                 fontsize=9)
    ax.axis("off")
    sq = fig.add_subplot(top[0, 3])
    side = 64
    rows = np.linspace(0, image.shape[0] - 1, side).round().astype(int)
    cols = np.linspace(0, image.shape[1] - 1, side).round().astype(int)
    sq.imshow(image[rows][:, cols])
    sq.set_title("a square ViT: squashed", fontsize=9)
    sq.axis("off")

    valid = batch["patch_valid"]
    ids = np.where(valid.numpy(), np.arange(1, valid.shape[0] + 1)[:, None], 0)
    cmap = _listed(["#cccccc", "#1f77b4", "#2ca02c", "#d62728"])
    ax = fig.add_subplot(top[1, :2])
    ax.imshow(ids, cmap=cmap, vmin=0, vmax=3, aspect="auto", interpolation="nearest")
    ax.set_yticks(range(3), ["4:1 (4x16)", "1:1 (7x7)", "1:3 (12x4)"], fontsize=7)
    ax.set_xlabel("patch slot (the batch's N = 64)", fontsize=8)
    ax.set_title("patch_valid: each image's patches, then padding", fontsize=9)
    ax.legend(handles=[Patch(color="#cccccc", label="padding (False)")], fontsize=7, loc="lower right")
    mask = key_padding_mask(valid, 1)[1, 0, 0]  # (1 + N,) for the square image: [CLS] + its 49 + 15 padding
    ax = fig.add_subplot(top[1, 2:])
    ax.imshow(mask[None].expand(len(mask), -1).numpy(), cmap=_listed(["#cccccc", "#2ca02c"]),
              interpolation="nearest")
    ax.set_xlabel("key ([CLS], then patch slots)", fontsize=8)
    ax.set_ylabel("query", fontsize=8)
    ax.set_title("attention mask of the 1:1 image: padding is never a key", fontsize=9)
    return fig


def _listed(colours):
    from matplotlib.colors import ListedColormap

    return ListedColormap(colours)


def write(out: Path, seed: int = 0) -> dict:
    """Draw the picture into `out` (PNG, written atomically) and return the batch it shows."""
    from vit.eval.plots import save_figure

    image = strip(seed)
    batch = naflex_batch(image)
    save_figure(figure(image, batch), out, dpi=72)
    return batch


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("docs/naflex.png"), help="the PNG to write")
    parser.add_argument("--seed", type=int, default=0, help="the strip's generator seed")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    batch = write(args.out, args.seed)
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KB): valid patches per image "
          f"{batch['patch_valid'].sum(1).tolist()} of {batch['patch_valid'].shape[1]}")


if __name__ == "__main__":
    main()
