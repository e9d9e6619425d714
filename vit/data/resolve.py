"""The config completed from the data, never from a model: the input channels the images have (`choose_channels`),
the preprocessing the pipeline is told (`resolve_data_config`, as timm's), and data paths made absolute so a saved
config works from any directory."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..config import Config, ConfigError
from .base import class_folders, image_files

__all__ = ["absolute_root", "data_channels", "choose_channels", "resolve_data_config", "GREY_MODES", "CHANNEL_PROBE"]


def absolute_root(root: str | None) -> str | None:
    """A local `data.root` that exists, as an absolute path (a relative one would break evaluate.py run from
    another directory); URLs, `pipe:` commands and paths that do not exist (the error names them) as given."""
    if not root or "://" in root or root.startswith("pipe:") or not Path(root).exists():
        return root
    return str(Path(root).absolute())


GREY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F"}  # PIL modes without colour
CHANNEL_PROBE = 256  # image headers read to tell a grey folder from a colour one (header only: ~0.1 ms each)


def data_channels(cfg: Config) -> tuple[int, str]:
    """(channels, why): 1 when the dataset's images are grey, else 3. The digits are grey; CIFAR and the
    synthetic set are colour; an ImageFolder is grey when every one of up to CHANNEL_PROBE image headers
    (taken across its classes) is; shards and Hugging Face datasets are taken as colour (not probed)."""
    name = cfg.data.dataset
    if name == "digits":
        return 1, "the digits are grey"
    if name != "imagefolder":
        return 3, f"{name} images are colour" if name != "wds" and name != "hf" else f"{name} data is read as RGB"
    from PIL import Image

    root = Path(cfg.data.root or ".")
    top = root / "train" if (root / "train").is_dir() else root
    files = [iter(sorted(image_files(top / c))) for c in (class_folders(top) if top.is_dir() else [])]
    if not files and top.is_dir():  # a flat folder of images (pretraining reads any layout)
        files = [iter(sorted(image_files(top)))]
    seen = 0
    while files and seen < CHANNEL_PROBE:  # round-robin over the classes: one grey class does not decide
        for it in list(files):
            path = next(it, None)
            if path is None:
                files.remove(it)
                continue
            try:
                with Image.open(path) as img:  # lazy: reads the header only
                    mode = img.mode
            except (OSError, ValueError):
                continue  # unreadable: found and named by FolderDataset.check
            if mode not in GREY_MODES:
                return 3, f"{path} is a colour image ({mode})"
            seen += 1
    return (1, f"all {seen} images probed in {top} are grey") if seen else (3, "no image was probed")


def choose_channels(cfg: Config) -> tuple[Config, str | None]:
    """`cfg` with model.in_chans decided, and a line to print once, or None. Unset (null): the data's channel
    count (`data_channels`), or that of aug.mean/std where the config sets them. Pinned to 1 on colour data:
    kept, and the line says that the colour is thrown away (a recipe for the grey digits pointed at a photo
    folder would otherwise train a grey model silently)."""
    m, a = cfg.model, cfg.aug
    if m.in_chans is None and (a.mean or a.std):
        return dataclasses.replace(cfg, model=dataclasses.replace(m, in_chans=len(a.mean or a.std))), None
    if m.in_chans == 3:
        return cfg, None
    found, why = data_channels(cfg)
    if m.in_chans is None:
        return dataclasses.replace(cfg, model=dataclasses.replace(m, in_chans=found)), None
    if found == 3:
        return cfg, (f"note: model.in_chans is pinned to 1, so the colour of this {cfg.data.dataset} data is thrown "
                     f"away ({why}); remove model.in_chans from the config (it then follows the data) or set "
                     "--model.in_chans=3 to keep it.")
    return cfg, None


def resolve_data_config(cfg: Config, pretrained_cfg: dict | None = None, in_chans: int | None = None) -> Config:
    """`cfg` with the preprocessing it leaves unset (aug.mean, std, eval_crop_pct, interpolation: None) taken from
    `pretrained_cfg`, the pretrained weights' config, as timm's resolve_data_config: the data pipeline is told
    the preprocessing (a model's `pretrained_cfg`, or `vit.models.pretrained_cfg_of(cfg.model)` for the weights
    the config names) and never looks a model up; without one, the fallbacks of `AugConfig.resolved`.
    Everything comes back filled, so the saved config says what was used. `in_chans`: the channels of a model
    already built (one loaded by name, which decides them): the pipeline follows it, not the config's default."""
    if in_chans is not None and in_chans != cfg.model.in_chans:
        if in_chans not in (1, 3):
            raise ConfigError(f"the model takes {in_chans} input channels, but the image pipelines give 3 (RGB) or "
                              "1 (grey); use a model built for one of those.")
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, in_chans=in_chans))
    return dataclasses.replace(cfg, aug=cfg.aug.resolved(pretrained_cfg, cfg.model.in_chans))
