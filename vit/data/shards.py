"""WebDataset tar shards: write them from an ImageFolder, find them again, and plan who reads which.

`write_shards` (the command: `python shards.py --from data/pets --out data/pets-wds --shard-size 1000`) writes
`train-00000.tar ...` and `val-00000.tar ...`, each sample `<key>.jpg|png|webp` (the file's original
bytes, never re-encoded; other formats such as BMP or TIFF become lossless PNG), `<key>.cls` (the class index as
text) and `<key>.json` (`{"filename": "<class>/<file>"}`), then `_info.json` in the layout timm's `wds/` reader
reads (timm/data/readers/reader_wds.py: `splits.<split>.{name, num_samples, filenames, shard_lengths}`) plus
`classes`, the class names, which timm ignores and we use. Train samples are shuffled across shards once, at
write time (as timm's ImageNet shards are), and shard lengths differ by at most one, so an epoch divides evenly
over workers as often as the data allows. Unreadable images are left out and named.

`ShardSplit` is a split as the reader sees it: shard URLs (local paths, http(s) URLs or `pipe:` commands) and
their lengths, from `_info.json` or from a brace pattern, as timm spells splits (`train`, or
`imagenet1k-train-{0000..1023}.tar|1281167`). `plan_epoch` assigns shards to the N x W workers of an epoch.
One shard's samples are read by `vit.data.shard_samples`.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import random
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..utils.atomic import atomic_write_bytes
from .base import DataError, class_folders, folder_classes, image_files
from .decode import BadImageError, decode_image

__all__ = ["webdataset", "write_shards", "read_info", "ShardSplit", "resolve_split", "plan_epoch", "INFO_NAME"]
log = logging.getLogger(__name__)

INFO_NAME = "_info.json"
MAX_INFO_BYTES = 64 * 2**20  # an _info.json larger than this is refused unread (ImageNet's is about 100 kB)
KEEP_BYTES = {".jpg": "jpg", ".jpeg": "jpg", ".png": "png", ".webp": "webp"}  # extension -> sample key


def webdataset():
    """The webdataset module, or one sentence saying how to get it."""
    try:
        import webdataset as wds
    except ImportError:
        raise DataError("shards are read and written with the webdataset package; "
                        "pip install -e '.[wds]' (or pip install webdataset).") from None
    return wds


# --- writing ----------------------------------------------------------------------------------------------------


def _balanced_lengths(n: int, shard_size: int) -> list[int]:
    """ceil(n / shard_size) shard lengths that differ by at most one and sum to n: 2500 at 1000 -> 834, 833, 833
    (not 1000, 1000, 500, whose short shard would cost every other worker 500 samples per epoch)."""
    k = max(1, math.ceil(n / shard_size))
    return [n // k + (i < n % k) for i in range(k)]


def _sample(path: Path) -> tuple[str, bytes]:
    """(key, bytes) of one image: the original bytes for JPEG/PNG/WebP, lossless PNG for anything else."""
    decode_image(path, max_side=64)  # raises BadImageError: refuse it here, not mid-training
    ext = KEEP_BYTES.get(path.suffix.lower())
    if ext is not None:
        return ext, path.read_bytes()
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(decode_image(path)).save(buf, format="PNG")
    return "png", buf.getvalue()


def write_shards(root: str | Path, out: str | Path, shard_size: int = 1000, splits: tuple[str, ...] = ("train", "val"),
                 seed: int = 0, overwrite: bool = False) -> dict:
    """Write the shards of an ImageFolder (`root/<split>/<class>/*`) into `out`; returns the info dict written
    to `out/_info.json`. Everything that can be checked without decoding is checked before anything is
    written; the shards are written into a temporary folder inside `out` and moved in when every split is
    done (with `overwrite`, the old shards of those splits and the old `_info.json` are removed first), and
    `_info.json` comes last: a folder with an `_info.json` holds complete shards."""
    wds = webdataset()
    root, out = Path(root), Path(out)
    listing = _check_sources(root, out, shard_size, splits, overwrite)  # everything checkable, before any write
    classes = folder_classes(root, splits[0])
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".vit-shards-", dir=out))  # the new shards; swapped in when all done
    except OSError as e:
        raise DataError(f"cannot create the --out folder {out} ({e.strerror or e}); choose a writable "
                        "folder.") from None
    info: dict = {"name": root.resolve().name, "splits": {}, "classes": classes}
    try:
        for split in splits:
            info["splits"][split] = _write_split(wds, root, split, listing[split], tmp, shard_size, seed)
        for split in splits:  # --overwrite: the old shards of these splits go, so no pattern or glob mixes them in
            for old in out.glob(f"{split}-*.tar"):
                old.unlink()
        (out / INFO_NAME).unlink(missing_ok=True)
        for split in splits:
            for name in info["splits"][split]["filenames"]:
                os.replace(tmp / name, out / name)
        atomic_write_bytes(out / INFO_NAME, (json.dumps(info, indent=1) + "\n").encode())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return info


def _check_sources(root: Path, out: Path, shard_size: int, splits: tuple[str, ...], overwrite: bool) -> dict:
    """{split: [(file, label)]} for every split, after every check that needs no decoding: nothing is written
    when a split folder is missing, a class is unknown, or --out cannot take the shards."""
    if shard_size < 1:
        raise DataError(f"--shard-size must be at least 1, got {shard_size}.")
    if not root.is_dir():
        raise DataError(f"{root} does not exist; point --from at an ImageFolder with train/ and val/.")
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} is a file; name a folder for the shards.")
    if out.is_dir() and not overwrite and ((out / INFO_NAME).exists() or any(out.glob("*.tar"))):
        raise DataError(f"{out} already holds shards; choose an empty --out folder or pass --overwrite.")
    missing = [s for s in splits if not (root / s).is_dir()]
    if missing:
        there = ",".join(s for s in splits if s not in missing)
        raise DataError(f"split folder {root / missing[0]} does not exist; add it, or write only the splits there "
                        f"are" + (f" with --splits {there}." if there else "."))
    index = {c: i for i, c in enumerate(folder_classes(root, splits[0]))}
    listing = {}
    for split in splits:
        folder_classes(root, split)
        files = []
        for c in class_folders(root / split):
            if c not in index:
                raise DataError(f"{root / split / c} is a class the {splits[0]} split does not have; every split "
                                "needs the same class folders.")
            files += [(p, index[c]) for p in sorted(image_files(root / split / c))]
        listing[split] = files
    return listing


def _write_split(wds, root: Path, split: str, files: list, tmp: Path, shard_size: int, seed: int) -> dict:
    """Decode-check and write one split's shards into `tmp`; its entry of _info.json."""
    files = list(files)
    if split == "train":  # shuffled once across shards; val keeps folder order
        random.Random(seed).shuffle(files)
    samples, bad = [], []
    for p, y in files:
        try:
            samples.append((*_sample(p), y, p.relative_to(root / split).as_posix()))
        except BadImageError as e:
            bad.append(str(e))
            log.warning("leaving out %s", e)
    if not samples:
        raise DataError(f"no readable image in {root / split}; fix or replace its images.")
    emptied = sorted(set(y for _, y in files) - set(y for _, _, y, _ in samples))
    if emptied:  # refused as an empty class folder is
        c = next(p.relative_to(root / split).parts[0] for p, y in files if y == emptied[0])
        raise DataError(f"every image of class folder {root / split / c} is unreadable, so the class has none "
                        "left; fix or replace them, or remove the folder.")
    names, lengths, start = [], _balanced_lengths(len(samples), shard_size), 0
    for k, n in enumerate(lengths):
        name = f"{split}-{k:05d}.tar"
        buf = io.BytesIO()
        with wds.TarWriter(buf, mtime=0) as w:  # mtime 0: the same folder gives the same bytes
            for i in range(start, start + n):
                ext, data, y, rel = samples[i]
                w.write({"__key__": f"{split}_{i:08d}", ext: data, "cls": str(y).encode(),
                         "json": json.dumps({"filename": rel}).encode()})
        atomic_write_bytes(tmp / name, buf.getvalue())
        names.append(name)
        start += n
    return {"name": split, "num_samples": len(samples), "filenames": names, "shard_lengths": lengths,
            "num_bad": len(bad)}


# --- reading: where the shards are ------------------------------------------------------------------------------


def read_info(root: str) -> dict:
    """`root/_info.json` (a folder, an http(s) base URL or a `pipe:` command prefix), {} if there is none."""
    wds = webdataset()
    if os.path.isdir(root) or "://" not in root and not root.startswith("pipe:"):
        path = Path(root) / INFO_NAME
        if not path.is_file():
            return {}
        try:
            if path.stat().st_size > MAX_INFO_BYTES:
                raise ValueError(f"it is larger than {MAX_INFO_BYTES} bytes")
            info = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise DataError(f"{path} is not readable JSON ({e}); rewrite it with python shards.py.") from None
        return _checked_info(info, str(path))
    try:
        with wds.gopen(_join(root, INFO_NAME)) as f:
            info = json.loads(f.read(MAX_INFO_BYTES + 1)[:MAX_INFO_BYTES])
    except Exception:  # a remote root without an info file: the split must then say its sample count
        return {}
    return _checked_info(info, _join(root, INFO_NAME))


def _checked_info(info, where: str) -> dict:
    classes = info.get("classes") if isinstance(info, dict) else None
    if not isinstance(info, dict) or classes is not None and not (
            isinstance(classes, list) and all(isinstance(c, str) for c in classes)):
        raise DataError(f"{where} is not a shard index (a mapping with 'splits', and 'classes' a list of names); "
                        "rewrite it with python shards.py.")
    return info


def _join(root: str, name: str) -> str:
    """A shard's URL: absolute ones as they are, others under root (a folder, a URL, or `pipe:cmd prefix`,
    to which the name is appended, as timm does: `pipe:curl -s https://host/data` + `/train-0.tar`)."""
    if not root or name.startswith(("/", "pipe:")) or "://" in name:
        return name
    return root.rstrip("/") + "/" + name


@dataclass(frozen=True)
class ShardSplit:
    """One split: shard URLs in order, and how many samples each holds."""
    urls: tuple[str, ...]
    lengths: tuple[int, ...]

    @property
    def num_samples(self) -> int:
        return sum(self.lengths)

    def offsets(self) -> list[int]:
        """The global index of each shard's first sample."""
        out, t = [], 0
        for n in self.lengths:
            out.append(t)
            t += n
        return out


def resolve_split(root: str, split: str, info: dict | None = None) -> ShardSplit:
    """A split named in `_info.json`, or a brace pattern (`train-{00000..00009}.tar`, relative to root or
    absolute) with `|<num_samples>` unless `_info.json` lists its shards."""
    from braceexpand import braceexpand

    info = read_info(root) if info is None else info
    splits = _checked_splits(info, _join(root, INFO_NAME))
    if ".tar" not in split and ".." not in split:
        if split not in splits:
            raise DataError(f"split '{split}' is not in {_join(root, INFO_NAME)} (it has {sorted(splits)}); name "
                            "one of those, or give a brace pattern such as 'train-{00000..00009}.tar|10000'.")
        s = splits[split]
        if len(s["filenames"]) != len(s["shard_lengths"]):
            raise DataError(f"split '{split}' in {_join(root, INFO_NAME)} lists {len(s['filenames'])} files but "
                            f"{len(s['shard_lengths'])} shard lengths; rewrite it with python shards.py.")
        return _existing(ShardSplit(tuple(_join(root, f) for f in s["filenames"]), tuple(s["shard_lengths"])), split)
    pattern, _, count = split.partition("|")
    names = list(braceexpand(pattern))
    known = {f: n for s in splits.values() for f, n in zip(s["filenames"], s["shard_lengths"])}
    if all(n in known for n in names):
        lengths = [known[n] for n in names]
        if count.strip().isdigit() and int(count) != sum(lengths):
            log.warning("warning: '%s' says %s samples, but %s lists %d for those shards; using %d.", split,
                        count.strip(), _join(root, INFO_NAME), sum(lengths), sum(lengths))
    elif count.strip().isdigit():  # lengths unknown: spread the count evenly (only the total is used exactly)
        total, k = int(count), len(names)
        lengths = [total // k + (i < total % k) for i in range(k)]
    else:
        raise DataError(f"the shards of '{split}' are not listed in {_join(root, INFO_NAME)}, so their sample count "
                        f"is unknown; append it as '{pattern}|<num_samples>'.")
    return _existing(ShardSplit(tuple(_join(root, n) for n in names), tuple(lengths)), split)


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")  # pipe:, http:, file:, s3:, C: ...


def plain_name(name) -> bool:
    """A shard name an `_info.json` may hold: a relative file name under its folder (`train-00000.tar`,
    `train/00000.tar`), never an absolute path, `..`, a URL or a `pipe:` command, which a reader would open or
    run as it is."""
    return (isinstance(name, str) and bool(name) and not name.startswith(("/", "~", "\\")) and "\0" not in name
            and not _SCHEME.match(name) and ".." not in name.replace("\\", "/").split("/"))


def _checked_splits(info: dict, where: str) -> dict:
    """`info["splits"]`, once every split's file names are plain names under the folder and its shard lengths
    non-negative integers; otherwise the folder is refused in one sentence."""
    splits = info.get("splits", {}) if isinstance(info, dict) else None
    if not isinstance(splits, dict) or not all(isinstance(s, dict) for s in splits.values()):
        raise DataError(f"{where} has no mapping of splits; rewrite it with python shards.py.")
    for name, s in splits.items():
        files, lengths = s.get("filenames"), s.get("shard_lengths")
        if not isinstance(files, list) or not isinstance(lengths, list):
            raise DataError(f"split '{name}' in {where} lacks its filenames or shard_lengths list; rewrite it with "
                            "python shards.py.")
        bad = [f for f in files if not plain_name(f)]
        if bad:
            bad = bad[0]
            raise DataError(f"{where} names shard {bad!r} for split '{name}', which is not a plain file name under "
                            "its folder (an absolute path, '..', a URL or a pipe: command); refusing the folder: "
                            "shard names in _info.json must be relative file names such as train-00000.tar.")
        wrong = [n for n in lengths if type(n) is not int or n < 0]
        if wrong:
            wrong = wrong[0]
            raise DataError(f"split '{name}' in {where} gives a shard length of {wrong!r}; shard lengths are sample "
                            "counts (integers, 0 or more): rewrite it with python shards.py.")
    return splits


def _existing(s: ShardSplit, split: str) -> ShardSplit:
    """`s`, once its local shards are known to exist (remote ones are found only when read)."""
    missing = [u for u in s.urls if "://" not in u and not u.startswith("pipe:") and not os.path.isfile(u)]
    if missing:
        raise DataError(f"{len(missing)} of the {len(s.urls)} shards of '{split}' do not exist, first: {missing[0]}; "
                        "fix the brace pattern or data.root.")
    for url, n in zip(s.urls, s.lengths):
        most = _most_samples(url)
        if most is not None and n > most:  # else evaluation pads the missing samples with zero images, forever
            raise DataError(f"shard {url} is said to hold {n} samples, but a file of its size holds at most {most}; "
                            "correct the count (in _info.json, or after '|' in the brace pattern).")
    return s


def _most_samples(url: str) -> int | None:
    """An upper bound on the samples a local shard can hold, from its size: a sample is an image and a .cls
    member, each a 512-byte header and at least one 512-byte block, so 2048 bytes of tar; gzip expands at most
    1032-fold. None for remote shards and other compressions (bz2, xz), whose count is checked when read."""
    if "://" in url or url.startswith("pipe:") or not os.path.isfile(url):
        return None
    size = os.path.getsize(url)
    with open(url, "rb") as f:
        head = f.read(262)
    if head[257:262] == b"ustar" or size < 512:
        return size // 2048
    if head[:2] == b"\x1f\x8b":
        return size * 1032 // 2048
    return None


# --- who reads what ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpochPlan:
    """Which shards each of the `num_readers` global workers reads in one epoch, and how many samples every
    worker yields (`quota`, the same for all, so that every process takes the same number of steps)."""
    shards: tuple[tuple[int, ...], ...]  # per global worker (rank * W + worker), shard indices in reading order
    quota: int


def plan_epoch(lengths: tuple[int, ...] | list[int], num_readers: int, epoch: int, seed: int,
               shuffle: bool = True) -> EpochPlan:
    """Shards shuffled by (seed, epoch), then dealt round-robin: reader g takes shards g, g + R, g + 2R, ...
    Every shard goes to exactly one reader. The quota is the smallest count any reader can get in any epoch
    (the sum of its k smallest shard lengths, k its number of shards), so it does not change between epochs:
    when the shard count divides evenly by R and the shards are of equal length, quota * R is the whole split;
    otherwise a reader stops after its quota and the samples left over are skipped for that epoch (a different
    random few each epoch). Without shuffle (evaluation) the quota is the largest count instead (see pad)."""
    order = list(range(len(lengths)))
    if shuffle:
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
    shards = tuple(tuple(order[g::num_readers]) for g in range(num_readers))
    if shuffle:
        small = sorted(lengths)
        quota = min(sum(small[:len(s)]) for s in shards)
    else:
        quota = max(sum(lengths[i] for i in s) for s in shards)
    return EpochPlan(shards, quota)
