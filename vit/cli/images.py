"""Which image files a command line names: files, folders (searched recursively), globs, and text lists of
paths, in input order, with a reason for everything passed over. The standard library and vit.data.decode's
suffix list only, so the torch-free predictor (`predict.py --onnx`) reads its inputs exactly as predict.py does.

    paths, skipped = collect_images(["photos/", "more/*.jpg", "list.txt"])
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from ..data.decode import IMG_EXTENSIONS

__all__ = ["LIST_SUFFIXES", "collect_images"]

LIST_SUFFIXES = {".txt", ".lst"}  # a file named on the command line with these suffixes lists paths, one a line


def _list_file(path: Path) -> list[Path]:
    """Paths listed in a text file, one a line; blank lines and '#' comments ignored; relative paths are
    relative to the list's own folder (so a list travels with its images)."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            p = Path(line).expanduser()
            out.append(p if p.is_absolute() else path.parent / p)
    return out


def _folder_files(folder: Path, skipped: list[tuple[str, str]]) -> list[Path]:
    """Every file under `folder` (not inside a hidden folder, nor hidden itself), sorted; a linked subfolder
    (not followed: it could loop or leave the folder) and an unreadable one are passed over by name."""
    found: list[Path] = []

    def unreadable(e: OSError) -> None:
        skipped.append((str(e.filename), f"an unreadable folder ({e.strerror or e})"))

    for top, dirs, files in os.walk(folder, onerror=unreadable):
        keep = []
        for d in sorted(dirs):
            if d.startswith("."):
                continue
            if os.path.islink(os.path.join(top, d)):
                skipped.append((os.path.join(top, d), "a link to a folder, not followed (name the folder itself)"))
            else:
                keep.append(d)
        dirs[:] = keep
        found += [Path(top) / f for f in files if not f.startswith(".") and not os.path.isdir(os.path.join(top, f))]
    return sorted(found)


def collect_images(specs: list[str]) -> tuple[list[Path], list[tuple[str, str]]]:
    """-> (candidate image files in input order, [(path, reason)] for what was passed over).

    A folder is searched recursively in sorted order; there only files with an image suffix are candidates,
    other files are passed over by name (hidden files silently). A file named directly, or in a list, is a
    candidate whatever its suffix: decoding decides. A name that matches nothing is passed over too."""
    paths: list[Path] = []
    skipped: list[tuple[str, str]] = []

    def add(p: Path, named: bool) -> None:
        if p.is_dir():
            found = _folder_files(p, skipped)
            if not found:
                skipped.append((str(p), "an empty folder"))
            for f in found:
                add(f, named=False)
        elif p.exists() and not p.is_file():  # a FIFO or a device (or a link to one) would hang or never end
            skipped.append((str(p), "not a regular file (a pipe, socket or device)"))
        elif not p.is_file():
            skipped.append((str(p), "no such file or folder"))
        elif named or p.suffix.lower() in IMG_EXTENSIONS:
            paths.append(p)
        else:
            skipped.append((str(p), f"not an image file (suffix {p.suffix or 'none'!r})"))

    for spec in specs:
        p = Path(spec).expanduser()
        if p.is_file() and p.suffix.lower() in LIST_SUFFIXES:
            for q in _list_file(p):
                add(q, named=True)
        elif p.exists():
            add(p, named=True)
        else:
            matches = sorted(glob.glob(spec, recursive=True))
            if not matches:
                skipped.append((spec, "no such file, folder or glob match"))
            for m in matches:
                add(Path(m), named=Path(m).is_file() and Path(m).suffix.lower() in IMG_EXTENSIONS)
    return paths, skipped


def images_given(specs: list[str], error: type[Exception] = ValueError) -> tuple[list[Path], list[tuple[str, str]]]:
    """collect_images(specs), with one sentence (`error`) when no image was named or none was found."""
    if not specs:
        raise error("no images given; pass image files, folders, globs or a .txt list of paths.")
    paths, skipped = collect_images(specs)
    if not paths:
        raise error(f"no image files found in {' '.join(specs)}; pass image files, folders, globs or a .txt list of "
                    "paths.")
    return paths, skipped


def crop_note(crop_pct: float, what: str, fix: str = "pass --aug.eval_crop_pct=1.0") -> str | None:
    """One line for stderr when the evaluation preprocessing centre-crops (`crop_pct` < 1, e.g. a hub ViT's 0.9):
    `what` then never sees the image's border, where an inspection image's defect may lie. None when it does not."""
    if crop_pct >= 1:
        return None
    return (f"note: {what} sees only the centre {crop_pct:.0%} of each image (eval_crop_pct {crop_pct:.3g}), so "
            f"anything nearer the border is cut away; {fix} to keep the whole image.")
