"""Reading a file that someone else wrote (a downloaded tokenizer.json, a config, preprocessing.json) without
hanging or exhausting memory: the file must be a regular file (a FIFO would block the read forever, a link to
/dev/zero would never end) of at most `max_bytes`, checked on the open descriptor before anything is read.
Standard library only, so torch-free code (the ONNX predictor, `--help`) may use it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["check_regular_file", "read_regular_file"]


def _refuse_special(path: Path, mode: int, what: str) -> None:
    if not stat.S_ISREG(mode):
        kind = "folder" if stat.S_ISDIR(mode) else "FIFO" if stat.S_ISFIFO(mode) else "device or socket"
        raise ValueError(f"{what} {path} is not a regular file (it is a {kind}, or a link to one), so it is not "
                         "read; replace it with the file itself.")


def _refuse_size(path: Path, size: int, max_bytes: int, what: str) -> None:
    if size > max_bytes:
        raise ValueError(f"{what} {path} is {size / 2**20:.1f} MB, larger than such a file can be "
                         f"({max_bytes / 2**20:.1f} MB), so it is not read; check that it is the right file.")


def check_regular_file(path: str | Path, max_bytes: int | None, what: str) -> Path:
    """`path` if it is a regular file (or a link to one) of at most `max_bytes` (None: any size), for a library
    that opens it by name (safetensors, tokenizers); FileNotFoundError when nothing is there, else ValueError in
    one sentence beginning with `what`."""
    path = Path(path)
    try:
        st = os.stat(path)  # follows links: the hub cache's snapshots are links to blobs
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} does not exist.") from None
    except OSError as e:  # a dangling or looping link, no permission
        raise ValueError(f"{what} {path} cannot be read ({e.strerror or e}); check its permissions.") from None
    _refuse_special(path, st.st_mode, what)
    if max_bytes is not None:
        _refuse_size(path, st.st_size, max_bytes, what)
    return path


def read_regular_file(path: str | Path, max_bytes: int, what: str) -> bytes:
    """The bytes of `path`, a regular file of at most `max_bytes`: opened without blocking (O_NONBLOCK, so a FIFO
    put there after a check cannot hang the open) and checked with fstat on that descriptor, then read up to
    `max_bytes` + 1 bytes (a file that grows while read is refused too). FileNotFoundError when nothing is there,
    else ValueError in one sentence beginning with `what` (e.g. "tokenizer.json of hf-hub:org/name:")."""
    path = check_regular_file(path, max_bytes, what)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise ValueError(f"{what} {path} cannot be read ({e.strerror or e}); check its permissions.") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        _refuse_special(path, st.st_mode, what)
        _refuse_size(path, st.st_size, max_bytes, what)
        try:
            data = f.read(max_bytes + 1)
        except OSError as e:
            raise ValueError(f"{what} {path} cannot be read ({e.strerror or e}).") from None
    _refuse_size(path, len(data), max_bytes, what)
    return data
