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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .untrusted_text import csv_cell

__all__ = ["staged_dir", "atomic_write_bytes", "atomic_write_text", "atomic_write_csv", "fsync_dir", "new_file_mode",
           "replace_dir"]


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
    """A CSV with a header row and one line per dict (keys not in `fieldnames` are an error, as in csv). Every
    text cell goes through `csv_cell` (vit/utils/untrusted_text.py): no spreadsheet formula, NUL or undecodable
    byte of a file or class name reaches the file."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fieldnames)
    writer.writeheader()
    writer.writerows({k: csv_cell(v) for k, v in row.items()} for row in rows)
    atomic_write_text(path, buf.getvalue())


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where the system or filesystem can't."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def carry_over(old: Path, new: Path) -> None:
    """Move the entries of folder `old` that `new` lacks into `new` (files someone else put beside ours)."""
    if not old.is_dir() or old.is_symlink():  # a file where the folder was: nothing to carry
        return
    for entry in sorted(old.iterdir()):
        if not (new / entry.name).exists() and not (new / entry.name).is_symlink():
            os.replace(entry, new / entry.name)


def replace_dir(new: str | Path, final: str | Path) -> None:
    """Put the complete folder `new` in the place of `final` as one step, so that a reader (or a process killed
    at any moment) sees the old folder or the new one, never a mix. Entries of the old folder that the new one
    lacks (an evaluation written into it, a README) are carried over. Where no atomic exchange exists, the old
    folder is renamed aside to `.old-<name>` first; `recover_dir` puts it back after a kill between the two renames."""
    new, final = Path(new), Path(final)
    fsync_dir(new)
    if not final.exists():
        os.replace(new, final)
    elif _exchange(new, final):  # `new` now holds the old folder
        carry_over(new, final)
        import shutil

        shutil.rmtree(new, ignore_errors=True)
    else:
        import shutil

        aside = final.parent / f".old-{final.name}"
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
        os.replace(new, final)
        carry_over(aside, final)
        shutil.rmtree(aside, ignore_errors=True)
    fsync_dir(final.parent)


def recover_dir(final: str | Path, temporaries: str) -> None:
    """Before writing `final` again: restore it if a kill fell between `replace_dir`'s two renames, and remove
    temporary folders (glob `temporaries` beside it) left by a killed writer, carrying over what they hold that
    `final` lacks (entries carried by an interrupted swap)."""
    import shutil

    final = Path(final)
    aside = final.parent / f".old-{final.name}"
    if aside.is_dir() and not final.exists():
        os.replace(aside, final)
    for stale in [aside, *final.parent.glob(temporaries)]:
        if stale.is_dir() and not stale.is_symlink():
            if final.is_dir():
                carry_over(stale, final)
            shutil.rmtree(stale, ignore_errors=True)


@contextmanager
def staged_dir(final: str | Path) -> Iterator[Path]:
    """Write a whole folder at once: yields an empty temporary folder beside `final` (after `recover_dir` cleans
    up a killed writer's), swapped in for `final` by `replace_dir` when the block ends, removed if it raises, so
    a kill or an error between files leaves the previous `final` whole."""
    import shutil

    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    recover_dir(final, f".tmp-{final.name}-*")
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    tmp.mkdir()
    try:
        yield tmp
        replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
