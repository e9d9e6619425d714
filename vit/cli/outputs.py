"""An output folder the scripts write into (train.py's run folder, predict/evaluate/visualize's --out): checked
writable before any work, held by one run at a time, and left holding only the latest run's outputs.

- `check_writable`: a real attempt (a temporary folder made and removed: permission bits say nothing to root),
  so a read-only folder, one below a file or on a full filesystem is refused in one sentence before the model
  is loaded or an image is read, instead of a traceback after all the inference.
- `OutputLock`: `.vit-out.lock` created with O_EXCL, holding the pid; a second run into the same folder is
  refused while that process lives; a lock left by a killed run (its pid gone) is taken over.
- `publish`: outputs are written into a temporary folder inside the output folder and moved into place at the
  end, replacing every output the script owns, so nothing of an earlier run (another --format, cam/ images)
  stays beside the new ones; a run that fails before the end leaves the earlier outputs as they were.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["OutputError", "check_writable", "OutputLock", "publish", "LOCK_NAME"]

LOCK_NAME = ".vit-out.lock"


class OutputError(ValueError):
    """An output folder that cannot be used (a file, not writable, held by another run); the scripts print it as
    one line. Not vit.config's ConfigError: predict.py --onnx writes through this module without PyYAML."""


def check_writable(folder: str | Path, what: str = "--out", fix: str = "pass a writable folder") -> None:
    """Fail early, creating nothing, if `folder` could not be made or written."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{what} {folder} is an existing file; pass a folder to write into.")
    existing = folder.absolute()
    while not existing.exists() and not existing.is_symlink():
        existing = existing.parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".vit-write-test-", dir=existing))
    except OSError as e:
        raise OutputError(f"cannot write to {what} {folder} ({existing}: {e.strerror}); {fix}.") from None


def _age(path: Path) -> float:
    import time

    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return float("inf")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


class OutputLock:
    """`with OutputLock(folder):` one run at a time in `folder` (created if needed); `hold=False`: a no-op (the
    other processes of a multi-process run, whose main process holds it)."""

    def __init__(self, folder: str | Path, hold: bool = True) -> None:
        self.path, self.hold, self.held = Path(folder) / LOCK_NAME, hold, False

    def __enter__(self) -> OutputLock:
        if not self.hold:
            return self
        self.created = [p for p in (self.path.parent, *self.path.parent.parents) if not p.exists()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                try:
                    pid = int(self.path.read_text().split()[0])
                except (OSError, ValueError, IndexError):
                    pid = None  # garbage, or being written this instant by its creator
                fresh = pid is None and _age(self.path) < 10  # an empty lock just made: its pid is coming
                if fresh or (pid is not None and pid != os.getpid() and _alive(pid)):
                    raise OutputError(f"--out {self.path.parent} is in use by another run (pid {pid or 'unknown'}); "
                                      "wait for it to finish or pass another --out.") from None
                self.path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            with os.fdopen(fd, "w") as f:
                f.write(f"{os.getpid()}\n")
            self.held = True
            return self
        raise OutputError(f"--out {self.path.parent}: could not take its lock {self.path.name}; pass another --out.")

    def __exit__(self, *exc) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False
            for folder in self.created:  # a run that wrote nothing leaves no folder it made for its lock
                try:
                    folder.rmdir()
                except OSError:
                    break


def new_staging(folder: str | Path, script: str) -> Path:
    """A fresh temporary folder inside `folder` for a run's outputs; those of killed runs are removed first."""
    folder = Path(folder)
    for stale in folder.glob(f".tmp-{script}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = folder / f".tmp-{script}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def publish(staging: Path, folder: Path, owned: tuple[str, ...]) -> None:
    """Replace every entry of `owned` in `folder` by the staged one (or remove it if this run wrote none)."""
    for name in owned:
        old, new = folder / name, staging / name
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        elif old.exists() or old.is_symlink():
            old.unlink()
        if new.exists():
            os.replace(new, old)
    shutil.rmtree(staging, ignore_errors=True)
