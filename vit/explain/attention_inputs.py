"""The images visualize_attention.py draws maps of: files, folders, globs and held-out digits (digits:0-7),
each once, named so that no map overwrites another's, with its true class when the layout tells it."""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np

from ..data import IMG_EXTENSIONS, DataError, build_datasets

__all__ = ["collect_inputs", "unique_names"]


def collect_inputs(specs: list[str], cfg, classes: list[str]) -> list[tuple[str, np.ndarray | Path, str | None]]:
    """(name, image array or path, true class or None) for every requested image, in order; an image named
    twice (a folder and a glob, or digits:0-3 and digits:2) once, where it first appears. The true class is known
    for a held-out digit, and for a file whose folder is named after one of the checkpoint's classes (the
    ImageFolder layout, root/<class>/<file>)."""
    items: list[tuple[str, np.ndarray | Path, str | None]] = []
    seen: set = set()
    val = None
    for spec in specs:
        if spec.startswith("digits:"):
            if cfg.data.dataset != "digits":
                raise DataError(f"{spec!r} names held-out digits, but this checkpoint was trained on "
                                f"{cfg.data.dataset}; pass image files instead.")
            if val is None:
                val = build_datasets(cfg, splits=("val",))[1]
            lo, _, hi = spec[len("digits:"):].partition("-")
            try:
                idx = range(int(lo), int(hi or lo) + 1)
            except ValueError:
                raise DataError(f"{spec!r} is not a digits index or range like digits:0-7.") from None
            for i in idx:
                if not 0 <= i < len(val):
                    raise DataError(f"digits index {i} is outside the held-out split (0-{len(val) - 1}).")
                if ("digits", i) not in seen:
                    seen.add(("digits", i))
                    items.append((f"digits_{i:04d}", val.images[i], classes[val.labels[i]]))
            continue
        p = Path(spec)
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.suffix.lower() in IMG_EXTENSIONS)
        elif p.is_file():
            files = [p]
        else:
            files = sorted(Path(f) for f in glob.glob(spec) if Path(f).suffix.lower() in IMG_EXTENSIONS)
        if not files:
            raise DataError(f"no images found for {spec!r}; pass image files, folders or globs.")
        for f in files:
            if f.resolve() not in seen:
                seen.add(f.resolve())
                items.append((f.stem, f, f.parent.name if f.parent.name in classes else None))
    return unique_names(items)


def unique_names(items: list[tuple]) -> list[tuple]:
    """Files that share a stem get as many of their parent folders as tell them apart: val/cat/0.png and
    val/dog/0.png become cat_0 and dog_0, val/cat/0.png and train/cat/0.png val_cat_0 and train_cat_0 (numbered
    only if the paths agree to the root), so that no map overwrites another's; the sidecar keeps the path."""
    out, used = [], set()
    for name, src, *rest in items:
        twins = [s.resolve() for n, s, *_ in items if n == name and isinstance(s, Path)]
        if len(twins) > 1 and isinstance(src, Path):
            me = src.resolve()
            for depth in range(1, len(me.parts)):
                key = me.parts[-depth - 1:-1]
                if sum(t.parts[-depth - 1:-1] == key for t in twins) == 1:
                    break
            name = "_".join([*key, name])
        base, k = name, 1
        while name in used:
            name, k = f"{base}_{k}", k + 1
        used.add(name)
        out.append((name, src, *rest))
    return out
