"""anomaly.py's inputs (vit/cli/commands/anomaly.py): where the detector is written or read (--bank, or
<checkpoint>/anomaly/[--detector/]), the backbone (one of ours, or a timm CNN through features_only), the tile a
model takes, and the fitted detector with the tile it was fitted on, refused when it was fitted on another
backbone."""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["bank_dir_of", "load_backbone", "check_tile_option", "detector_and_tile"]


def bank_dir_of(args) -> Path:
    """Where the detector is written (fit) or read (score): --bank, or <checkpoint>/anomaly/[--detector/]."""
    from vit.config import ConfigError
    from vit.eval.anomaly_settings import ANOMALY_DIR, check_detector_name, detector_folder

    if args.detector is not None and not args.checkpoint:
        raise ConfigError("--detector names a folder under <checkpoint>/anomaly/: pass --checkpoint, or --bank FOLDER "
                          "with --model.")
    if args.bank and args.detector is not None:
        raise ConfigError("--bank is the detector's folder and --detector names one under <checkpoint>/anomaly/; "
                          "pass one of them.")
    if args.bank:
        return Path(args.bank)
    if not args.checkpoint:
        raise ConfigError("with --model, pass --bank FOLDER: where the bank is written and read.")
    try:
        if args.mode == "fit":
            root = Path(args.checkpoint) / ANOMALY_DIR
            folder = root / check_detector_name(args.detector) if args.detector is not None else root
            if folder.exists() and not folder.is_dir():
                raise ConfigError(f"--detector {args.detector} names the file {folder}, not a detector's folder; "
                                  "choose another name.")
            return folder
        return detector_folder(args.checkpoint, args.detector) or Path(args.checkpoint) / ANOMALY_DIR
    except ValueError as e:
        raise ConfigError(str(e)) from None



def load_backbone(args, overrides):
    """(model, config) of --model: one of ours through load_model, or a timm CNN (ResNet, wide_resnet50_2, ...)
    through timm's features_only (vit.models.cnn_backbone) with --weights or timm's weights by name."""
    from vit.cli.args import load_model
    from vit.config import ConfigError, apply_overrides, from_dict
    from vit.data.resolve import resolve_data_config
    from vit.models.cnn_backbone import is_cnn_name, load_cnn_backbone

    if not is_cnn_name(args.model):
        return load_model(args, overrides)[:2]
    if args.mode == "fit" and args.method == "dinomaly":
        raise ConfigError(f"Dinomaly rebuilds a ViT's patch tokens with Transformer blocks, and {args.model} is a CNN; "
                          "use --method patchcore or anomalydino with it, or a ViT backbone for Dinomaly.")
    model, lines = load_cnn_backbone(args.model, args.weights, not args.weights, args.img_size)
    for line in lines:
        print(line)
    cfg = from_dict(apply_overrides({"model": {"name": args.model, "img_size": model.patch_embed.img_size[0]}},
                                    overrides))
    return model, resolve_data_config(cfg, model.pretrained_cfg, model.in_chans)



def check_tile_option(tile: int, cfg, model) -> None:
    """--tile must be an RGB square the model takes: its input size, or a patch multiple with dynamic_img_size."""
    from vit.config import ConfigError

    if cfg.data.naflex is not None or cfg.model.in_chans != 3:
        raise ConfigError("--tile cuts RGB images into square tiles, and this model reads "
                          + ("NaFlex patches of each image whole" if cfg.data.naflex is not None else
                             f"{cfg.model.in_chans}-channel images") + "; leave --tile out.")
    size, step, dynamic = cfg.model.img_size, model.patch_embed.token_step[0], getattr(model, "dynamic_img_size", False)
    if tile < 1 or tile % step or (tile != size and not dynamic):
        takes = f"a multiple of {step} pixels" if dynamic else f"its input size, {size} (it was built for one size)"
        raise ConfigError(f"--tile {tile} is not a tile this model takes: use {takes}, e.g. --tile {size}.")



def detector_and_tile(args, model, cfg, bank_dir: Path):
    """The fitted detector; args.tile set to the tile it was fitted with when none is given (a detector of tiles
    scores tiles), and a note when a whole-image detector is scored in tiles."""
    from vit.config import ConfigError
    from vit.deploy.export import fingerprint
    from vit.eval.anomaly_settings import SETTINGS_FILE, read_settings
    from vit.eval.dinomaly import load_detector

    det = load_detector(bank_dir)
    settings = read_settings(bank_dir / SETTINGS_FILE, "fit it again with anomaly.py fit")
    fitted = settings.get("tile")
    if settings.get("backbone_fingerprint") not in (None, fingerprint(model)):  # same width, other weights: nonsense
        weights = f" with {settings['weights']}" if settings.get("weights") else ""
        raise ConfigError(f"the detector in {bank_dir} was fitted on another backbone ({settings.get('backbone')}"
                          f"{weights}), whose features this one's do not match; score with that backbone, or fit "
                          "the detector again with this one.")
    if args.tile is None and fitted is not None:
        args.tile = int(fitted)
        check_tile_option(args.tile, cfg, model)
    if args.tile is not None and fitted is None and det.threshold is not None:
        print("note: the detector and its threshold were fitted on whole images; a tiled image's score is its worst "
              "tile's, so long images flag more often: fit with --tile too.", file=sys.stderr)
    return det
