"""A timm CNN (ResNet-18, wide_resnet50_2, ConvNeXt, EfficientNet ...) as a backbone for the anomaly methods, read
the way they read a ViT: `forward_intermediates(x, indices)` gives the (B, C, h, w) maps of the stages in
`indices`. PatchCore's own backbone is a CNN (Roth et al., 2022: wide_resnet50_2, layer2 and layer3), and so is
anomalib's default; industrial users bring these.

The stages are timm's `features_only` levels (`feature_info`): for a ResNet 0 is the stem, 1 to 4 are layer1 to
layer4, so PatchCore's layer2 + layer3 are indices 2 and 3 (`default_layers`, the two levels before the last). The
feature model runs only as far as the deepest stage asked for. A stage's maps are coarser the deeper it is; the
anomaly code brings them to the grid of the first stage read, as PatchCore and anomalib do (`grid_size` is that
grid for an input size).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from ..config import ConfigError

__all__ = ["CnnBackbone", "is_cnn_name", "load_cnn_backbone"]


def is_cnn_name(name: str | None) -> bool:
    """Whether `name` (a timm name, maybe with a .tag) is a timm model this project does not build itself: a CNN or
    other non-ViT timm architecture, built through timm's features_only."""
    if not name or ":" in name:  # hf-hub:, local-dir: name our own models
        return False
    import timm

    from .variants import VARIANTS

    base = name.split(".", 1)[0]
    return base not in VARIANTS and timm.is_model(base)


class CnnBackbone(nn.Module):
    """timm's features_only model of `name` (every level, `feature_info`) behind the intermediates interface of
    `vit.models.VisionTransformer`: forward_intermediates, grid_size, in_chans, pretrained_cfg, and the input
    geometry the anomaly command reads (`patch_embed.img_size`, `patch_embed.token_step`: the coarsest level's
    stride, the step a tile must be a multiple of). Any input size is taken (`dynamic_img_size`)."""

    dynamic_img_size = True

    def __init__(self, name: str, img_size: int | None = None, pretrained: bool = False, in_chans: int = 3) -> None:
        super().__init__()
        import timm

        self.name = name
        self.body = timm.create_model(name, pretrained=pretrained, features_only=True, in_chans=in_chans)
        self.feature_info = self.body.feature_info
        self.in_chans = in_chans
        self.pretrained_cfg = dict(getattr(self.body, "pretrained_cfg", None) or {})
        size = img_size or self.pretrained_cfg.get("input_size", (3, 224, 224))[-1]
        step = max(self.feature_info.reduction())
        self.patch_embed = SimpleNamespace(img_size=(size, size), token_step=(step, step))
        # FeatureListNet (ResNet, ConvNeXt ...): level -> its module, run one by one up to the deepest asked for;
        # a model with its own feature class (EfficientNet ...) runs whole
        layers = getattr(self.body, "return_layers", None)
        self._levels = list(layers) if layers else None
        self._grids: dict[tuple, tuple[int, int]] = {}

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every level's maps (timm's features_only forward)."""
        return self.body(x)

    @property
    def depth(self) -> int:
        """The number of levels forward_intermediates can return."""
        return len(self.feature_info)

    def default_layers(self) -> tuple[int, ...]:
        """The two levels before the last (a ResNet's layer2 and layer3: PatchCore's and anomalib's default)."""
        n = self.depth
        return (max(0, n - 3), max(0, n - 2)) if n > 2 else (0,)

    def forward_intermediates(self, x: torch.Tensor, indices: list[int] | tuple[int, ...], output_fmt: str = "NCHW",
                              intermediates_only: bool = True) -> list[torch.Tensor]:
        """The (B, C, h, w) maps of the levels in `indices`, in that order; the stages after the deepest are not run."""
        if output_fmt != "NCHW" or not intermediates_only:
            raise ValueError("a CNN backbone gives its levels' maps only, as (B, C, h, w) (output_fmt='NCHW').")
        bad = [i for i in indices if not -self.depth <= i < self.depth]
        if bad or isinstance(x, dict):
            naflex = " and a NaFlex batch" if isinstance(x, dict) else ""
            raise ValueError(f"{self.name} has levels 0 to {self.depth - 1} (feature_info) and reads whole image "
                             f"tensors; got levels {list(indices)}{naflex}.")
        indices = [i % self.depth for i in indices]
        if self._levels is None:
            maps = self.body(x)
            return [maps[i] for i in indices]
        want = {self._levels[i]: None for i in indices}
        left = len(want)
        for name, module in self.body.items():  # the modules in order, up to the deepest level asked for
            x = module(x)
            if name in want:
                want[name], left = x, left - 1
                if not left:
                    break
        return [want[self._levels[i]] for i in indices]

    @torch.no_grad()
    def grid_size(self, size: tuple[int, int], level: int | None = None) -> tuple[int, int]:
        """The (h, w) of `level`'s maps (default: the first of `default_layers`) for an input of `size` pixels, found
        once per size by running the stages on zeros (padding rules differ between CNNs)."""
        level = self.default_layers()[0] if level is None else level
        key = (tuple(size), level)
        if key not in self._grids:
            p = next(self.parameters())
            probe = torch.zeros(1, self.in_chans, *size, dtype=p.dtype, device=p.device)
            self._grids[key] = tuple(self.forward_intermediates(probe, [level])[0].shape[-2:])
        return self._grids[key]


def load_cnn_backbone(name: str, weights: str | Path | None = None, pretrained: bool = False,
                      img_size: int | None = None) -> tuple[CnnBackbone, list[str]]:
    """(the backbone in eval mode, lines saying what loaded): `weights`, a timm weights file of `name` (its classifier
    dropped), or `pretrained`, timm's weights by name from the hub cache."""
    from ..hub.weights import read_state_dict

    if not (weights or pretrained):
        raise ConfigError(f"--model {name} (a timm CNN) needs --weights FILE (its timm weights) or --pretrained "
                          "(timm's weights by name from the hub cache).")
    model = CnnBackbone(name, img_size, pretrained=pretrained and not weights)
    lines = [f"{name}: timm's {'features_only model' if weights else 'weights by name'}, levels "
             f"{model.depth} (strides {model.feature_info.reduction()})"]
    if weights:
        state = read_state_dict(weights)
        own = model.body.state_dict()
        missing = [k for k in own if k not in state]
        if missing:
            raise ConfigError(f"{weights} is not a {name} weights file: {len(missing)} of the backbone's tensors are "
                              f"missing ({', '.join(missing[:3])} ...); pass the weights of this architecture.")
        wrong = [k for k in own if state[k].shape != own[k].shape]
        if wrong:
            k = wrong[0]
            raise ConfigError(f"{weights} does not fit {name}: {k} is {tuple(state[k].shape)}, the model's "
                              f"{tuple(own[k].shape)}; pass the weights of this architecture.")
        model.body.load_state_dict({k: state[k] for k in own})
        lines[0] += f", weights from {weights}"
    return model.eval(), lines
