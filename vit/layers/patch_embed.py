"""Patch embedding (Dosovitskiy et al., 2021, "An Image is Worth 16x16 Words", eq. 1).

An image (B, C, H, W) is cut into non-overlapping P x P patches, each flattened and linearly projected to D.
A Conv2d with kernel = stride = P is exactly that linear map applied to every patch, named `proj` as in timm.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["PatchEmbed", "to_2tuple"]


def to_2tuple(x: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    if isinstance(x, int):
        return (x, x)
    x = tuple(x)
    if len(x) != 2:
        raise ValueError(f"expected an int or a (height, width) pair, got {x!r}.")
    return x  # type: ignore[return-value]


class PatchEmbed(nn.Module):
    """Images (B, C, H, W) -> patch tokens (B, h*w, D), row-major, h = H // P_h and w = W // P_w: one Conv2d
    (`proj`, kernel = stride = patch size) is the same linear map applied to every flattened patch. The image
    size fixes `grid_size` and `num_patches`; `dynamic_grid` gives the grid of another size that the patches
    tile, and `set_input_size` changes size or patch size in place (the projection resampled as FlexiViT).
    `norm_layer` normalises every patch token after the projection (`norm`, timm's embed_norm_layer)."""

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        bias: bool = True,
        norm_layer: Callable[[int], nn.Module] | None = None,
    ) -> None:
        super().__init__()
        self.img_size = to_2tuple(img_size)
        self.patch_size = to_2tuple(patch_size)
        # timm's rule at a fixed size: floor(S / P) patches per side, the convolution leaves out the last S mod P
        # pixels (so400m at 384 px with patch 14: 27 x 27 patches, 6 pixels dropped). create_model refuses such a
        # size when a caller asks for it (vit.models.build); only a variant's own size (timm's) gets here.
        self.grid_size = (self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1])
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size, bias=bias)
        self.norm = norm_layer(embed_dim) if norm_layer is not None else nn.Identity()  # AIMv2's token norm

    @property
    def reduction(self) -> int:
        """Input pixels per token along the longer patch side (timm's feature_info reduction)."""
        return max(self.patch_size)

    @property
    def token_step(self) -> tuple[int, int]:
        """Input pixels per token along each side (h, w): the patch size (a hybrid's stem stride times it)."""
        return tuple(self.patch_size)

    def dynamic_grid(self, height: int, width: int) -> tuple[int, int]:
        """The patch grid (h, w) of an input of the given size; raises if the patches don't tile it."""
        ph, pw = self.patch_size
        if height % ph or width % pw:
            # The built size keeps its grid with the remainder dropped, as timm's conv does (so400m 384/14). Asked
            # only here so that an exported program with dynamic sides gets no guard on the built size.
            if (height, width) == tuple(self.img_size):
                return self.grid_size
            raise ValueError(
                f"input of size {height}x{width} is not divisible by the patch size {ph}x{pw}; "
                "resize or crop it to a multiple of the patch size."
            )
        return height // ph, width // pw

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, C, H, W) -> (B, D, h, w) -> (B, h*w, D), patches in row-major order.
        return self.norm(self.proj(x).flatten(2).transpose(1, 2))

    def set_input_size(
        self, img_size: int | tuple[int, int] | None = None, patch_size: int | tuple[int, int] | None = None
    ) -> None:
        """Another input size and/or patch size, in place. A new patch size resizes the projection with timm's
        `resample_patch_embed` (FlexiViT, Beyer et al., 2023: the pseudo-inverse resize keeps token values)."""
        img = self.img_size if img_size is None else to_2tuple(img_size)
        patch = self.patch_size if patch_size is None else to_2tuple(patch_size)
        for side, (s, p) in zip(("height", "width"), zip(img, patch)):
            if s % p != 0 and (img, patch) != (self.img_size, self.patch_size):
                raise ValueError(
                    f"image {side} {s} is not divisible by patch size {p}; pick an image size that is a "
                    "multiple of the patch size."
                )
        if patch != self.patch_size:
            from timm.layers import resample_patch_embed

            old = self.proj
            self.proj = nn.Conv2d(old.in_channels, old.out_channels, patch, stride=patch, bias=old.bias is not None,
                                  device=old.weight.device, dtype=old.weight.dtype)
            with torch.no_grad():
                self.proj.weight.copy_(resample_patch_embed(old.weight, list(patch)))
                if old.bias is not None:
                    self.proj.bias.copy_(old.bias)
        self.img_size, self.patch_size = img, patch
        self.grid_size = (img[0] // patch[0], img[1] // patch[1])
        self.num_patches = self.grid_size[0] * self.grid_size[1]
