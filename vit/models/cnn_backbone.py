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

import logging
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

    def __init__(self, name: str, img_size: int | None = None, pretrained: bool = False, in_chans: int = 3,
                 weights: str | Path | None = None) -> None:
        super().__init__()
        import timm

        self.name = name
        overlay = {"pretrained_cfg_overlay": {"file": str(weights)}} if weights else {}
        builder = logging.getLogger("timm.models._builder")  # its note on the classifier's keys a feature model drops
        level, _ = builder.level, builder.setLevel(logging.ERROR)
        try:
            self.body = timm.create_model(name, pretrained=pretrained, features_only=True, in_chans=in_chans,
                                          **overlay)
        finally:
            builder.setLevel(level)
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


def _check_weights(name: str, weights: str | Path) -> None:
    """One sentence unless the file holds `name`'s weights: every tensor of timm's full model of `name` but its
    classifier, each of its shape, and nothing else (a ResNet-34 file read as ResNet-18 would load its first blocks
    and drop the rest without a word)."""
    import timm

    from ..hub.weights import read_state_dict

    state = read_state_dict(weights)
    with torch.device("meta"):
        full = timm.create_model(name)
    head = (full.pretrained_cfg or {}).get("classifier") or ""
    heads = tuple(h + "." for h in ([head] if isinstance(head, str) else head) if h)
    own = {k: v.shape for k, v in full.state_dict().items() if not k.startswith(heads)}
    missing = [k for k in own if k not in state]
    extra = [k for k in state if k not in own and not k.startswith(heads)]
    wrong = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k])]
    if missing or extra or wrong:
        said = (f"{len(missing)} of its tensors are missing ({', '.join(missing[:3])} ...)" if missing else
                f"it has {len(extra)} tensors {name} does not ({', '.join(extra[:3])} ...)" if extra else
                f"{wrong[0]} is {tuple(state[wrong[0]].shape)}, {name}'s {tuple(own[wrong[0]])}")
        raise ConfigError(f"{weights} is not a {name} weights file: {said}; pass the weights of this architecture.")


def load_cnn_backbone(name: str, weights: str | Path | None = None, pretrained: bool = False,
                      img_size: int | None = None) -> tuple[CnnBackbone, list[str]]:
    """(the backbone in eval mode, lines saying what loaded): `weights`, a timm weights file of `name` (checked whole,
    its classifier dropped; timm's features_only model reads it as it reads its own files, names flattened), or
    `pretrained`, timm's weights by name from the hub cache."""
    if not (weights or pretrained):
        raise ConfigError(f"--model {name} (a timm CNN) needs --weights FILE (its timm weights) or --pretrained "
                          "(timm's weights by name from the hub cache).")
    if weights:
        _check_weights(name, weights)
    try:
        model = CnnBackbone(name, img_size, pretrained=True, weights=weights)
    except ConfigError:
        raise
    except Exception as e:  # the hub unreachable, the weights not cached, a file timm cannot read
        raise ConfigError(f"timm could not load {name}'s weights ({str(e).strip().splitlines()[0][:160]}); pass "
                          "--weights FILE, a timm weights file of it, or run once online to cache them.") from None
    step = model.patch_embed.token_step[0]
    if model.patch_embed.img_size[0] < step:
        raise ConfigError(f"--img-size {model.patch_embed.img_size[0]} is smaller than {name}'s coarsest stride "
                          f"({step} pixels), which would leave no feature map; use at least {step}.")
    lines = [f"{name}: timm's features_only model, levels {model.depth} (strides {model.feature_info.reduction()}), "
             + (f"weights from {weights}" if weights else "timm's weights by name")]
    return model.eval(), lines
