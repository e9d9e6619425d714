"""Atomic file writing: a file is either the old complete one or the new complete one, never half of each.

Each writer puts the bytes in a temporary file beside the target, fsyncs it, renames it over the target
(`os.replace`, atomic on POSIX) and fsyncs the folder, so a process killed mid-write (SIGKILL, OOM, power loss
after the fsync) leaves the previous file in place. The new file gets the mode a plain `open(path, "w")`
would give it: the existing file's mode when one is replaced, otherwise 0666 minus the user's umask
(`tempfile.mkstemp` alone would leave every file 0600).

Imports only the standard library: checkpoints, plots and the scripts all write through it, and drawing a
PNG must not import the model.
"""

from __future__ import annotations

import csv
import io
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_write_csv", "fsync_dir", "new_file_mode"]


def fsync_dir(path: str | Path) -> None:
    """Make a rename inside `path` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    """The process umask, read without changing it where Linux exposes it (os.umask can only set it)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)  # set-and-restore: the only portable way to read it
    os.umask(old)
    return old


def new_file_mode(path: str | Path) -> int:
    """The permission bits `path` should have once written: its current ones if it exists, else 0666 & ~umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename; creates the parent folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = new_file_mode(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)  # mkstemp makes 0600; the file renamed into place must look like any other we write
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """`atomic_write_bytes` for UTF-8 text."""
    atomic_write_bytes(path, text.encode())


def atomic_write_csv(path: str | Path, fieldnames: list[str], rows: list[dict]) -> None:
    """A CSV with a header row and one line per dict (keys not in `fieldnames` are an error, as in csv)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fieldnames)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())
