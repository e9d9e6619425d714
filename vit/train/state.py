"""Training states: what a resume reads, saved so that it is complete or absent, and checked before it is read.

Accelerate's training state (model, optimizer, scheduler, RNG, plus the loop's own files) is saved into a fresh
temporary folder that is renamed to `state/step-XXXXXXXX` only once complete. Its `COMPLETE` marker is a manifest
(size and SHA-256 of every file): `verify_state` checks it before anything is loaded, so a truncated, corrupted or
planted file is never read, and `latest_state` falls back to the older kept state. Nothing in a state is
unpickled with `weights_only=False`: the loop's own state is JSON, EMA weights are safetensors, and Accelerate
reads its files with `weights_only=True`. Model checkpoints (best/, last/) are vit/models/checkpoint.py's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from ..models.checkpoint import CheckpointError
from ..utils.atomic import atomic_write_text, fsync_dir, new_file_mode
from ..utils.faults import fault_point

__all__ = ["state_dir_name", "sha256", "verify_state", "latest_state", "save_state_atomic"]


def state_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_state(path: str | Path) -> dict:
    """Check a state folder against its manifest before anything in it is loaded: the same files, none added,
    none missing, each with the size and SHA-256 it was written with; RNG files must load with weights_only=True
    (Accelerate skips an unreadable one silently, which would break exactness). Returns the manifest, or raises
    CheckpointError saying what differs."""
    path = Path(path)
    try:
        manifest = json.loads((path / "COMPLETE").read_text())
        int(manifest["step"])
        files = {str(k): (int(v[0]), str(v[1])) for k, v in manifest["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        raise CheckpointError(f"state {path} has no readable manifest (COMPLETE); it was not saved completely by "
                              "this version of train.py.") from None
    present = {str(f.relative_to(path)) for f in path.rglob("*") if not f.is_dir() or f.is_symlink()}
    present.discard("COMPLETE")
    extra, missing = sorted(present - set(files)), sorted(set(files) - present)
    if extra or missing:
        what = f"holds a file train.py did not write ({extra[0]})" if extra else f"is missing {missing[0]}"
        raise CheckpointError(f"state {path} {what}.")
    for name, (size, digest) in files.items():
        f = path / name
        if f.is_symlink() or not f.is_file():
            raise CheckpointError(f"state {path}: {name} is not a regular file.")
        if f.stat().st_size != size or sha256(f) != digest:
            raise CheckpointError(f"state {path}: {name} is not the file that was saved (truncated, corrupted or "
                                  "replaced).")
    from accelerate.utils.other import load  # torch.load(weights_only=True) with numpy's RNG arrays allowed

    for f in sorted(path.glob("random_states_*.pkl")):
        try:
            rng = load(f)
            rng["random_state"], rng["numpy_random_seed"], rng["torch_manual_seed"]
        except Exception as e:  # UnpicklingError for a planted pickle, KeyError/TypeError for another object
            raise CheckpointError(f"state {path}: {f.name} is not an RNG state ({str(e).splitlines()[0][:120]}).") \
                from None
    return manifest


def latest_state(run_dir: str | Path, warn=None) -> Path | None:
    """The newest state folder of a run that passes `verify_state`, or None if the run saved none. A damaged
    newest state is reported through `warn` and the older kept one is tried; if every state is damaged,
    CheckpointError."""
    root = Path(run_dir) / "state"
    if not root.is_dir():
        return None
    done = sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-") and
                   (p / "COMPLETE").is_file()), reverse=True)
    errors = []
    for p in done:
        try:
            verify_state(p)
            return p
        except CheckpointError as e:
            errors.append(str(e))
            if warn is not None:
                warn(f"warning: {e} Trying the previous saved state.")
    if errors:
        raise CheckpointError(f"no saved state in {root} is intact (newest: {errors[0]}); start over with "
                              "--run.overwrite=true or pick another --run.name.")
    return None


def save_state_atomic(accelerator, run_dir: str | Path, step: int, keep: int = 2,
                      extra: dict[str, bytes] | None = None) -> Path | None:
    """accelerator.save_state into a temporary folder, plus `extra` files ({name: bytes}, written by the main
    process), then a manifest, then rename it into place; keep the newest `keep`."""
    root = Path(run_dir) / "state"
    final = root / state_dir_name(step)
    tmp = root / f".tmp-{state_dir_name(step)}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):  # left by a process killed mid-save
            shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()
    try:
        _write_state(accelerator, tmp, final, root, step, keep, extra)
    except OSError as e:  # a full disk, a quota, a folder gone read-only: the partial folder goes, the older stays
        shutil.rmtree(tmp, ignore_errors=True)
        kept = [p.name for p in sorted(root.glob("step-*")) if (p / "COMPLETE").is_file()]
        kept_note = f"the older state {root / kept[-1]} is untouched" if kept else "no earlier state was saved"
        raise CheckpointError(f"could not save the training state of step {step} into {root} "
                              f"({e.strerror or e}); {kept_note}; free space or fix the folder, then continue "
                              "with --resume=auto.") from None
    accelerator.wait_for_everyone()
    return final


def _write_state(accelerator, tmp: Path, final: Path, root: Path, step: int, keep: int,
                 extra: dict[str, bytes] | None) -> None:
    accelerator.save_state(str(tmp), safe_serialization=True)
    if accelerator.is_main_process:
        for name, data in (extra or {}).items():
            (tmp / name).write_bytes(data)
    fault_point("state", step)  # files written, folder not yet renamed into place
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        files = {}
        mode = new_file_mode(tmp / "COMPLETE")  # 0666 & ~umask: safetensors' own writer leaves 0600
        for f in sorted(tmp.rglob("*")):
            if f.is_file():
                os.chmod(f, mode)
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
                files[str(f.relative_to(tmp))] = [f.stat().st_size, sha256(f)]
        atomic_write_text(tmp / "COMPLETE", json.dumps({"step": step, "files": files}, indent=1))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        fsync_dir(root)
        old = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-"))[:-keep]
        for p in old:
            shutil.rmtree(p, ignore_errors=True)
