"""A PatchCore bank's settings file, patchcore.json: one reader and one set of checks for every path that scores
with a bank (anomaly.py, predict.py and the demo through `vit.eval.anomaly.load_patchcore`; predict.py --onnx
through `vit.deploy.onnx_anomaly.OnnxPatchCore`). Standard library only, so the torch-free predictor imports it.

    settings = read_settings(folder / SETTINGS_FILE, "rebuild it with anomaly.py fit")
    settings["threshold"]   # None (no verdict) or a finite float: NaN would call every image good (s >= NaN is
                            # False), a string would fail mid-run, so neither gets past here
    settings["method"]      # which detector the folder holds (METHOD_NAMES; files written before it: patchcore)

The file is named for the first method; every method's folder has one, so a folder of another method is found
and named, not mistaken for a missing bank.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

__all__ = ["SETTINGS_FILE", "MAX_SETTINGS_BYTES", "METHOD_NAMES", "ANOMALY_DIR", "check_threshold", "read_settings",
           "detector_folder", "detector_names", "check_detector_name", "check_whole_images"]

SETTINGS_FILE = "patchcore.json"
ANOMALY_DIR = "anomaly"  # <checkpoint>/anomaly/: where fit writes a detector, and predict.py and demo.py look for it
METHOD_NAMES = ("patchcore", "anomalydino", "dinomaly")  # anomaly.py fit --method
MAX_SETTINGS_BYTES = 1 << 20  # a settings file is a few hundred bytes; anything larger is not one


def check_threshold(value, where: str, redo: str) -> float | None:
    """None, or the threshold as a float; ValueError (one sentence naming `where` and what to do, `redo`) for
    anything but a finite number (NaN, infinity, a string, true/false)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where} has threshold {value!r}, not a finite number (NaN would call every image "
                         f"good); {redo}.")
    return float(value)


def _whole(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def read_settings(path: str | Path, redo: str) -> dict:
    """patchcore.json at `path` as a dict whose `layers` (a list of block indices >= 0), `neighbourhood` (odd,
    >= 1), `threshold` (`check_threshold`) and, when present, `grid` ([rows, columns] >= 1) are checked; any other
    content is a ValueError of one sentence ending in `redo`."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SETTINGS_BYTES + 1)
        if len(raw) > MAX_SETTINGS_BYTES:
            raise ValueError(f"it is over {MAX_SETTINGS_BYTES} bytes")
        settings = json.loads(raw)
    except (OSError, ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"{path} is not a PatchCore settings file ({str(e)[:120]}); {redo}.") from None
    if not isinstance(settings, dict):
        raise ValueError(f"{path} holds {type(settings).__name__}, not a settings object; {redo}.")
    layers, hood = settings.get("layers"), settings.get("neighbourhood")
    if not isinstance(layers, list) or not layers or not all(_whole(i, 0) for i in layers):
        raise ValueError(f"{path} has layers {layers!r}, not a list of block indices; {redo}.")
    if not _whole(hood, 1) or hood % 2 == 0:
        raise ValueError(f"{path} has neighbourhood {hood!r}, not an odd whole number of patches; {redo}.")
    settings["threshold"] = check_threshold(settings.get("threshold"), str(path), redo)
    settings.setdefault("method", "patchcore")
    settings.setdefault("normalize", False)
    settings.setdefault("top_share", 0.0)
    share = settings["top_share"]
    if settings["method"] not in METHOD_NAMES or not isinstance(settings["normalize"], bool) or isinstance(
            share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
        raise ValueError(f"{path} has method {settings['method']!r}, normalize {settings['normalize']!r} and "
                         f"top_share {share!r}: not one of {', '.join(METHOD_NAMES)}, true/false and a share in "
                         f"[0, 1]; {redo}.")
    grid = settings.get("grid")
    if grid is not None and not (isinstance(grid, list) and len(grid) == 2 and all(_whole(g, 1) for g in grid)):
        raise ValueError(f"{path} has grid {grid!r}, not [rows, columns] of whole numbers >= 1; {redo}.")
    return settings


def check_detector_name(name: str) -> str:
    """A detector's name (anomaly.py fit --detector): one plain folder name, kept under <checkpoint>/anomaly/."""
    if not name or name in (".", "..") or name.startswith(".") or any(
            not (c.isalnum() or c in "-_.") for c in name) or len(name) > 100:
        raise ValueError(f"--detector {name!r:.60} is not a detector name: use up to 100 letters, digits, '-', '_' "
                         "and '.' (not first), e.g. --detector screws.")
    return name


def detector_names(checkpoint: str | Path) -> list[str]:
    """The named detectors beside a checkpoint: the folders of <checkpoint>/anomaly/ that hold a settings file."""
    folder = Path(checkpoint) / ANOMALY_DIR
    return sorted(p.name for p in folder.iterdir() if (p / SETTINGS_FILE).is_file()) if folder.is_dir() else []


def detector_folder(checkpoint: str | Path | None, name: str | None = None) -> Path | None:
    """The folder of a checkpoint's detector: <checkpoint>/anomaly/ (anomaly.py fit without --detector), or
    <checkpoint>/anomaly/<name>/, one of several fitted beside the same backbone (one per part type). None when the
    checkpoint has no detector and none is named; ValueError (one sentence) for a name it does not hold, or for no
    name where it holds only named ones."""
    if checkpoint is None:
        return None
    root = Path(checkpoint) / ANOMALY_DIR
    names = detector_names(checkpoint)
    if name is not None:
        if (root / check_detector_name(name) / SETTINGS_FILE).is_file():
            return root / name
        held = f"it holds {', '.join(names)}" if names else "it holds no named detector"
        raise ValueError(f"{checkpoint} has no detector {name!r} ({held}); fit it with anomaly.py fit --detector "
                         f"{name}.")
    if (root / SETTINGS_FILE).is_file() or not root.is_dir():
        return root if root.is_dir() else None
    if names:
        raise ValueError(f"{checkpoint} holds {len(names)} named detectors ({', '.join(names)}); choose one with "
                         f"--detector NAME.")
    return root  # an anomaly/ folder with no settings file: the loader says what is missing


def check_whole_images(folder: Path) -> Path:
    """`folder`, when its detector scores whole images: one fitted with --tile (its bank, model and threshold are of
    tiles at the images' own scale) is a ValueError of one sentence, as predict.py, demo.py and export.py read every
    image whole and its threshold would not hold for them."""
    if not (folder / SETTINGS_FILE).is_file():  # nothing fitted there: the loader says what is missing
        return folder
    tile = read_settings(folder / SETTINGS_FILE, "rebuild it with anomaly.py fit").get("tile")
    if tile is not None:
        raise ValueError(f"the detector in {folder} was fitted on {tile} x {tile} tiles of images at their own scale, "
                         "and this reads each image whole, where its threshold does not hold; score with anomaly.py "
                         "score (which tiles as fitted), or fit a detector without --tile.")
    return folder
