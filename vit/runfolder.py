"""One run folder, one training: a lock, no silent overwrite, and a resume that checks the config it resumes.

    runs/<name>/.lock        flock'ed by the training writing the folder (pid inside, for the message)
    runs/<name>/resume.log   one line per resume: which state, and the config keys that changed

The lock is `fcntl.flock` on an open file: the kernel drops it when the process exits, however it exits
(SIGKILL included), so a lock left by a killed training is stale by construction and the next one takes it.
A run folder that already holds a run is refused unless the run is resumed (`--resume=auto`) or replaced
(`--run.overwrite=true`): starting afresh over it would mix two runs' checkpoints, metrics and states.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from pathlib import Path
from typing import Any

from .config import Config, diff

__all__ = ["RunFolderError", "RunLock", "check_not_locked", "holds_run", "check_new_run", "clear_run", "resume_changes",
           "SAFE_ON_RESUME", "log_resume"]

RUN_ENTRIES = ("config.yaml", "metrics.csv", "state", "best", "last", "top", "tensorboard", "curves.png",
               "resume.log")
# What a resume may change: none of them alters what a step computes. run.epochs stretches the learning-rate
# schedule from the resumed step on (it is recorded); run.name/output_dir differ for a moved run folder;
# everything else refused (model, data, batch size, seed, optimizer, augmentation, precision) would make the
# resumed run a different one, or fail to load.
SAFE_ON_RESUME = {"run.name", "run.output_dir", "run.epochs", "run.max_steps", "run.resume", "run.overwrite", "run.log_every", "run.eval_every",
                  "run.save_state_every", "run.keep_best", "run.on_nonfinite", "data.num_workers",
                  "data.eval_batch_size", "data.download", "data.on_bad_image"}


class RunFolderError(ValueError):
    """A run folder that cannot be used as asked; the message says what to do."""


class RunLock:
    """An exclusive, non-blocking lock on `run_dir` held until `release()` or the process ends."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / ".lock"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(self.fd)
            self.fd = None
            raise RunFolderError(f"run folder {self.path.parent} is in use by another training (pid {holder}); "
                                 "wait for it to finish or pass another --run.name.") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the only descriptor drops the flock
            self.fd = None

    def __del__(self) -> None:
        self.release()


def check_not_locked(run_dir: str | Path) -> None:
    """Fail fast, creating nothing, if a training holds the folder's lock (it is taken for real later)."""
    try:
        fd = os.open(Path(run_dir) / ".lock", os.O_RDWR)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        raise RunFolderError(f"run folder {run_dir} is in use by another training (pid {holder}); "
                             "wait for it to finish or pass another --run.name.") from None
    finally:
        os.close(fd)


def holds_run(run_dir: str | Path) -> bool:
    """Whether anything a training writes is already in `run_dir`."""
    return any((Path(run_dir) / name).exists() for name in RUN_ENTRIES)


def check_new_run(run_dir: str | Path, resume: str | None, overwrite: bool) -> None:
    """Refuse to start a run into a folder holding another one, unless resuming it or replacing it."""
    run_dir = Path(run_dir)
    if resume and resume != "auto" and holds_run(run_dir):
        if Path(run_dir / "state").absolute() not in Path(resume).absolute().parents:
            raise RunFolderError(f"--resume={resume} is not a state of run {run_dir}, which already holds a run; "
                                 "resume into a new --run.name.")
    if resume or overwrite or not holds_run(run_dir):
        return
    raise RunFolderError(f"run folder {run_dir} already holds a run; pass --resume=auto to continue it, another "
                         "--run.name for a new run, or --run.overwrite=true to replace it.")


def clear_run(run_dir: str | Path) -> None:
    """Delete what a previous training wrote (run.overwrite=true); the lock and foreign files stay."""
    for name in RUN_ENTRIES:
        p = Path(run_dir) / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()


def resume_changes(saved: Config, new: Config, source: str) -> dict[str, tuple[Any, Any]]:
    """The config keys that differ from the saved run's; refuse (one sentence naming them) any that is not in
    SAFE_ON_RESUME, return the allowed ones to be recorded."""
    changes = diff(saved, new)
    refused = {k: v for k, v in changes.items() if k not in SAFE_ON_RESUME}
    if refused:
        shown = ", ".join(f"{k} ({a!r} -> {b!r})" for k, (a, b) in sorted(refused.items()))
        raise RunFolderError(f"cannot resume {source} with a changed {shown}: a resumed run must compute what the "
                             "saved one did; restore the saved values (see its config.yaml) or start a new "
                             "--run.name.")
    return {k: v for k, v in changes.items() if k not in ("run.resume", "run.overwrite")}


def log_resume(run_dir: str | Path, state: Path, step: int, epoch: int, changes: dict[str, tuple[Any, Any]]) -> str:
    """Append one line to resume.log and return it."""
    what = "; changed " + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in sorted(changes.items())) if changes \
        else ""
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} resumed from {state.name} at epoch {epoch}, step {step}{what}"
    with open(Path(run_dir) / "resume.log", "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    return line
