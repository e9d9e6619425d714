"""One run folder, one training: a lock, no silent overwrite, and a resume that checks the config it resumes.

    runs/<name>/.lock        flock'ed by the training writing the folder (pid inside, for the message)
    runs/<name>/resume.log   one line per resume: which state, and the config keys that changed

The lock is `fcntl.flock` on an open file: the kernel drops it when the process exits, however it exits
(SIGKILL included), so a lock left by a killed training is stale by construction and the next one takes it.
A run folder that already holds a run is refused unless the run is resumed (`--resume=auto`) or replaced
(`--run.overwrite=true`): starting afresh over it would mix two runs' checkpoints, metrics and states.
train.py saves and resumes through `save_run_state` / `resume_run`: Accelerate's files plus the loop's state
as JSON, EMA weights as safetensors and the config, all under `verify_state`'s manifest (vit/train/state.py).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from ..config import Config, diff, dump, from_dict, read_yaml
from ..hub.weights import check_finite
from ..models.checkpoint import CheckpointError
from .state import latest_state, save_state_atomic, verify_state

__all__ = ["RunFolderError", "RunLock", "check_not_locked", "holds_run", "check_new_run", "clear_run", "resume_changes",
           "SAFE_ON_RESUME", "log_resume", "claim_run_dir", "resume_run", "save_run_state", "check_run_weights",
           "interrupt_note", "saved_checkpoints", "kept_note", "check_process_count", "read_task_state",
           "TASK_STATE_JSON", "TASK_STATE_TENSORS"]

TASK_STATE_JSON, TASK_STATE_TENSORS = "task_state.json", "task_state.safetensors"  # a state folder's Task.task_state
RUN_ENTRIES = ("config.yaml", "metrics.csv", "state", "best", "last", "top", "tensorboard", "wandb", "curves.png",
               "resume.log")
# What a resume may change: none of them alters what a step computes. run.epochs stretches the learning-rate
# schedule from the resumed step on (it is recorded); run.name/output_dir differ for a moved run folder;
# everything else refused (model, data, batch size, seed, optimizer, augmentation, precision) would make the
# resumed run a different one, or fail to load.
SAFE_ON_RESUME = {"run.name", "run.output_dir", "run.epochs", "run.max_steps", "run.resume", "run.overwrite",
                  "run.log_every", "run.eval_every", "run.save_state_every", "run.keep_best", "run.keep_states",
                  "run.on_nonfinite",
                  "data.num_workers", "run.num_threads", "data.eval_batch_size", "data.download", "data.on_bad_image",
                  "model.grad_checkpointing",  # recomputes activations; the same gradients
                  "run.log_with", "run.project"}  # where the numbers are also sent


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


def saved_checkpoints(run_dir: str | Path) -> list[str]:
    """What a previous training saved that can be continued or used: complete states, best/, last/, top/."""
    run_dir = Path(run_dir)
    states = [f"state/{p.name}" for p in sorted((run_dir / "state").glob("step-*")) if (p / "COMPLETE").is_file()]
    return states + [f"{name}/" for name in ("best", "last", "top") if (run_dir / name).exists()]


def kept_note(run_dir: str | Path) -> str:
    """What a failed training leaves behind, for its one-line message."""
    saved = saved_checkpoints(run_dir)
    if saved:
        return f"what {run_dir} already held ({', '.join(saved)}) is untouched"
    return f"no checkpoint had been saved in {run_dir} yet, so a rerun with the same --run.name starts afresh"


def check_new_run(run_dir: str | Path, resume: str | None, overwrite: bool) -> None:
    """Refuse to start a run into a folder holding another one, unless resuming it or replacing it."""
    run_dir = Path(run_dir)
    if resume and resume != "auto" and holds_run(run_dir):
        if Path(run_dir / "state").absolute() not in Path(resume).absolute().parents:
            raise RunFolderError(f"--resume={resume} is not a state of run {run_dir}, which already holds a run; "
                                 "resume into a new --run.name.")
    if resume or overwrite or not holds_run(run_dir) or not saved_checkpoints(run_dir):
        return  # a run that failed before saving anything does not block its name
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
    if None in (saved.run.mixed_precision, new.run.mixed_precision):  # null: whatever `accelerate launch` was
        changes.pop("run.mixed_precision", None)  # told (runs saved before train.py wrote the precision it ran)
    for key in ("model.name", "model.in_chans"):  # null: left to the weights / the data, which the saved run
        if key in changes and changes[key][1] is None:  # resolved (train.py resolves it again the same way)
            changes.pop(key)
    root = changes.get("data.root")
    if root and None not in root and Path(root[0]).absolute() == Path(root[1]).absolute():
        changes.pop("data.root")  # saved relative (train.py before it made data.root absolute): the same folder
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


# --- what train.py calls ----------------------------------------------------------------------------------


def interrupt_note(run_dir: Path | None) -> str:
    """What a Ctrl-C leaves behind in `run_dir`, for run_cli's one line."""
    if run_dir is None or not run_dir.is_dir():
        return "nothing was saved"
    states = sorted(p.name for p in (run_dir / "state").glob("step-*") if (p / "COMPLETE").is_file())
    kept = f"state/{states[-1]} (continue with --resume=auto)" if states else "no training state yet"
    return f"{run_dir} keeps {kept} and the last/ and best/ checkpoints of finished epochs"


def claim_run_dir(accelerator, cfg, run_dir: Path) -> RunLock | None:
    """Lock the run folder (main process), refuse another run's folder, clear it for run.overwrite=true.
    Taken only now, so that a bad dataset or model has created nothing."""
    lock = None
    if accelerator.is_main_process:
        lock = RunLock(run_dir)
        check_new_run(run_dir, cfg.run.resume, cfg.run.overwrite)  # again, under the lock
        if cfg.run.overwrite:
            clear_run(run_dir)
            accelerator.print(f"run.overwrite=true: deleted the previous run in {run_dir}")
        elif cfg.run.resume in (None, "auto") and holds_run(run_dir) and not saved_checkpoints(run_dir):
            clear_run(run_dir)  # its config.yaml, logs and metrics of a run that has nothing to continue
            accelerator.print(f"reusing {run_dir}: its previous run saved no checkpoint; starting afresh")
    accelerator.wait_for_everyone()
    return lock


def resume_run(accelerator, cfg, run_dir: Path, state, ema, task=None) -> None:
    """Load the newest intact state (or the one named), after checking its files and its config; `task`'s own
    state too (Task.load_task_state), which a task that keeps one refuses to start without."""
    from safetensors.torch import load_file

    if cfg.run.resume == "auto":
        path = latest_state(run_dir, warn=accelerator.print)
        if path is None:
            # nothing to continue (claim_run_dir cleared what a run that saved nothing left): the new config
            accelerator.print(f"resume=auto: no saved state in {run_dir}/state, starting fresh")
            return
    else:
        path = Path(cfg.run.resume)
        if not path.is_dir():
            raise CheckpointError(f"resume state {path} does not exist; pass --resume=auto or a state/step-* folder.")
        verify_state(path)
    changes = resume_changes(from_dict(read_yaml(path / "config.yaml")), cfg, str(path))
    try:
        saved = json.loads((path / "train_state.json").read_text())
        expected = set(dataclasses.asdict(type(state)()))
        # states written before loss_sums / num_processes existed still load
        if set(saved) - expected or expected - set(saved) - {"loss_sums", "num_processes"}:
            raise ValueError(f"train_state.json has keys {sorted(saved)}")
    except Exception as e:
        raise CheckpointError(f"state {path} is unreadable ({str(e).splitlines()[0][:200]}); it is not what "
                              "train.py wrote.") from None
    check_process_count(saved, accelerator.num_processes, path)
    try:  # Accelerate reads the model from safetensors, the optimizer and RNG with weights_only=True
        accelerator.load_state(str(path))
        state.__dict__.update(saved)
        if ema is not None:
            ema.load_state_dict(load_file(str(path / "ema.safetensors")))
        if task is not None:
            read_task_state(task, path)
    except RunFolderError:  # the task refuses the state (a distillation's other teacher): its own sentence
        raise
    except Exception as e:
        raise CheckpointError(f"state {path} is unreadable ({str(e).splitlines()[0][:200]}); it is not what "
                              "train.py wrote.") from None
    if accelerator.is_main_process:
        accelerator.print(log_resume(run_dir, path, state.step, state.epoch, changes))


def read_task_state(task, path: Path) -> None:
    """Give `task` the state a state folder holds for it (Task.load_task_state); a task that keeps a state refuses
    a folder without one."""
    from safetensors.torch import load_file

    values_file, tensors_file = path / TASK_STATE_JSON, path / TASK_STATE_TENSORS
    if not values_file.is_file() and not tensors_file.is_file():
        if any(task.task_state()):  # a task that keeps a state and a state folder without it
            raise ValueError(f"it holds no {TASK_STATE_JSON} or {TASK_STATE_TENSORS}, which {type(task).__name__} "
                             "keeps")
        return
    values = json.loads(values_file.read_text()) if values_file.is_file() else {}
    task.load_task_state(values, load_file(str(tensors_file)) if tensors_file.is_file() else {})


def check_process_count(saved: dict, num_processes: int, path: Path) -> None:
    """Refuse a state trained by another number of processes, as a changed data.batch_size is refused: the
    batch is per process, so the global batch (and the data each step sees) would change. A state written
    before num_processes was recorded tells it by its per-process loss sums, if it has them."""
    count = saved.get("num_processes") or len(saved.get("loss_sums") or []) or None
    if count is not None and int(count) != num_processes:
        def plural(n):
            return f"{n} process" + ("es" if n != 1 else "")
        raise RunFolderError(f"cannot resume {path} with {plural(num_processes)}: it was saved by {plural(int(count))} "
                             f"and data.batch_size is per process, so the global batch would change; launch with "
                             f"--num_processes {count} or start a new --run.name.")


def save_run_state(accelerator, cfg, run_dir: Path, state, model, ema, loss_sum, loss_n: int, task=None) -> None:
    """Accelerate's state plus ours (JSON), EMA weights (safetensors), the config and the task's own state
    (Task.task_state: task_state.json, task_state.safetensors; none when it is empty), in one verified folder."""
    from safetensors.torch import save

    check_run_weights(accelerator, model, state, run_dir)
    # the running sum differs per process; its mean over processes, divided by loss_n, is the epoch's mean
    mine = torch.as_tensor(loss_sum, device=accelerator.device).float().reshape(1)
    state.loss_sums = [float(v) for v in accelerator.gather(mine).tolist()]  # exact, one per process
    state.loss_sum = float(accelerator.reduce(mine.clone(), "mean").item())
    state.loss_n = loss_n
    state.num_processes = accelerator.num_processes
    extra = {"train_state.json": json.dumps(dataclasses.asdict(state)).encode(), "config.yaml": dump(cfg).encode()}
    if ema is not None:
        extra["ema.safetensors"] = save({k: v.detach().cpu().contiguous() for k, v in ema.state_dict().items()})
    values, tensors = task.task_state() if task is not None else ({}, {})
    if values:
        extra[TASK_STATE_JSON] = json.dumps(values).encode()
    if tensors:
        extra[TASK_STATE_TENSORS] = save({k: v.detach().cpu().contiguous() for k, v in tensors.items()})
    save_state_atomic(accelerator, run_dir, state.step, keep=cfg.run.keep_states, extra=extra)


def check_run_weights(accelerator, model, state, run_dir: Path) -> None:
    """Stop a run whose weights training made non-finite, in one sentence naming the step and what is kept."""
    weights = {k: v for k, v in accelerator.unwrap_model(model).state_dict().items()}
    check_finite(weights, f"the weights became non-finite by step {state.step} (epoch {state.epoch}); nothing was "
                          f"saved at this point and {kept_note(run_dir)}", "lower optim.lr or enable optim.clip_grad.")
