"""The seg: section's checks (data.dataset: segmentation; docs/segmentation.md): its keys only where they are read,
the head's settings in range, and the options of other sections a per-pixel target cannot take."""

from __future__ import annotations

import dataclasses

from .errors import ConfigError
from .schema import Config, SegConfig

__all__ = ["validate_seg"]


def _check_dpt(s: SegConfig) -> None:
    if s.dpt_sizes is not None and (len(s.dpt_sizes) != 4 or min(s.dpt_sizes) < 1):
        raise ConfigError(f"config key 'seg.dpt_sizes' must list four positive widths (one per reassembled block), "
                          f"got {s.dpt_sizes}.")
    good = all(f >= 1 and f == int(f) or 0 < f < 1 and (1 / f) == int(1 / f) for f in s.dpt_factors)
    if len(s.dpt_factors) != 4 or not good:
        raise ConfigError(f"config key 'seg.dpt_factors' must list four resampling factors, each a whole number "
                          f"(4, 2, 1) or one over one (0.5, 0.25), got {s.dpt_factors}.")


def validate_seg(cfg: Config) -> None:
    """Refuse, in one sentence naming the key, a seg.* setting that cannot work (module docstring)."""
    s, d = cfg.seg, cfg.data
    if d.dataset != "segmentation":
        changed = [f.name for f in dataclasses.fields(SegConfig) if getattr(s, f.name) != getattr(SegConfig(), f.name)]
        if changed:
            raise ConfigError(f"config key 'seg.{changed[0]}' is read only with data.dataset segmentation, and "
                              f"data.dataset is {d.dataset!r}; remove it or set data.dataset=segmentation.")
        return
    if not d.root:
        raise ConfigError("config key 'data.root' must name the segmentation folder (train/ and val/, each with "
                          "images/ and masks/, or train.csv and val.csv).")
    if s.classes is not None and s.classes_file is not None:
        raise ConfigError("config keys 'seg.classes' and 'seg.classes_file' both name the classes; set one of them.")
    if s.classes is not None and not (1 < len(s.classes) < 256 and len(set(s.classes)) == len(s.classes)):
        raise ConfigError(f"config key 'seg.classes' must list 2 to 255 distinct names, got {s.classes}.")
    for key in ("blocks", "dpt_width", "window"):
        v = getattr(s, key)
        if v is not None and v < 1:
            raise ConfigError(f"config key 'seg.{key}' must be at least 1, got {v}.")
    _check_dpt(s)
    if d.naflex is not None and d.naflex.max_num_patches < 4:
        raise ConfigError(f"config key 'data.naflex.max_num_patches' is {d.naflex.max_num_patches}, which leaves a "
                          "square image a single patch to segment (and the linear head's BatchNorm nothing to "
                          "train on); give segmentation at least 4 (a 2x2 grid).")
    if s.window is not None and d.naflex is not None:
        raise ConfigError("config key 'seg.window' slides square windows over a large image, and data.naflex reads "
                          "each image whole at its own aspect ratio; remove one of them.")
    for key, bad, why in (("aug.mixup", cfg.aug.mixup > 0, "mixes labels, not masks"),
                          ("aug.cutmix", cfg.aug.cutmix > 0, "mixes labels, not masks"),
                          ("data.sampler", d.sampler != "shuffle", "balances images by one label each"),
                          ("data.labels_file", bool(d.labels_file), "lists image labels"),
                          ("distill.teacher", cfg.distill.teacher is not None, "teaches image labels"),
                          ("model.freeze", cfg.model.freeze and cfg.optim.lora_rank > 0, "is set with LoRA")):
        if bad:
            raise ConfigError(f"config key '{key}' {why}, which a segmentation run (data.dataset=segmentation) "
                              "cannot use; remove it.")
