"""What the scripts share at run time: the Accelerator, and turning user errors into one clear line.

Accelerate only picks its multi-process CPU mode (gloo) when asked for the CPU explicitly; started by
`accelerate launch --multi_gpu --num_processes 2` on a machine without CUDA, each process would otherwise
believe it is alone and evaluate everything twice. `make_accelerator` asks for the CPU in exactly that case.
Accelerate (1.15) also turns FSDP on only for accelerators: launched with configs/accelerate/fsdp.yaml on a
CPU-only machine it would silently train plain DDP instead. torch's FSDP2 (`fully_shard`) runs on gloo, so
`make_accelerator` switches the state to FSDP there (CI and the tests train the FSDP path on CPU).

Threads, loader workers and precision left at `auto` come from the machine (`apply_machine_defaults`). On a
small CPU the thread count matters more than anything else: each launcher sets its own (`python train.py`:
torch's default, one per core; `accelerate launch`: OMP_NUM_THREADS=1; with a config that says use_cpu: one
per core), and BLAS threads that share cores with loader workers spin against each other. Measured on 2 cores
(README, Training, Threads): 2 threads beside a loader 7-144 img/s, 1 thread 300-400 img/s. So every launcher gets the
same split: the process's share of the CPUs, minus one core per loader worker, each worker with one thread.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from accelerate import Accelerator

from ..config import Config, ConfigError
from ..train.preemption import EXIT_CODE as PREEMPTED_EXIT
from ..train.preemption import Preempted
from ..utils.untrusted_text import printable

__all__ = ["make_accelerator", "run_cli", "check_options", "apply_machine_defaults", "machine_cpus",
           "resolve_workers", "resolve_threads", "resolve_precision", "single_process_note", "worker_message"]


def run_cli(main: Callable[[], int], interrupt_note: Callable[[], str] | None = None) -> None:
    """Run a script's `main()` and exit with its code. A user's mistake (our errors are ValueErrors: config,
    data, checkpoint), a missing file or a non-finite loss becomes one line on stderr and exit code 2; Ctrl-C
    one line saying what was kept (`interrupt_note()`), exit code 130 as a shell reports it; SIGTERM (handled by
    train.py's loop, vit/train/preemption.py) one line saying which state was saved, exit code 143."""
    try:
        code = main()
    except (ValueError, FileNotFoundError, FloatingPointError) as e:
        print(f"error: {printable(worker_message(e), keep=chr(10))}", file=sys.stderr)  # escapes shown, not obeyed
        code = 2
    except KeyboardInterrupt:
        note = interrupt_note() if interrupt_note is not None else "files already written are complete"
        print(f"interrupted (Ctrl-C); {note}.", file=sys.stderr)
        code = 130
    except Preempted as e:  # SIGTERM: the loop saved a state (its message), or nothing new was there to save
        note = str(e) or (interrupt_note() if interrupt_note is not None else "files already written are complete")
        if os.environ.get("RANK", "0") == "0":  # one line, not one per process
            print(f"terminated (SIGTERM); {note}.", file=sys.stderr)
        code = PREEMPTED_EXIT
    sys.exit(code)


def worker_message(e: BaseException) -> str:
    """An error's own message, also when a DataLoader worker raised it: torch re-raises it in the main process with
    the worker's whole traceback as its message ("Caught DataError in DataLoader worker process 0. Original
    Traceback ..."), where the user's one sentence is the part after the last "<module>.<class>: "."""
    text = str(e)
    if not (text.startswith("Caught ") and "\nOriginal Traceback" in text):
        return text
    for name in (f"{type(e).__module__}.{type(e).__qualname__}: ", f"{type(e).__qualname__}: "):
        i = text.rfind("\n" + name)
        if i >= 0:
            return text[i + 1 + len(name):].strip()
    return text.strip().splitlines()[-1]


# DDP compares each gradient's strides with its bucket's, size-1 dimensions included. With one image per process,
# cls_token's (1, 1, D) gradient is the [:, :1] slice of the token gradient (1, 1 + N, D): strides ((1 + N) * D,
# D, 1) against the parameter's (D, D, 1). Autograd's layout contract ignores size-1 dimensions, so nothing is
# wrong and the cost is one D-element copy; timm's ViT does the same. PyTorch then prints a 4-line UserWarning
# from every process (the "only the main process prints" promise); this one message is silenced.
GRAD_STRIDES_WARNING = "Grad strides do not match bucket view strides"


def make_accelerator(**kwargs) -> Accelerator:
    warnings.filterwarnings("ignore", message=GRAD_STRIDES_WARNING, category=UserWarning)
    if kwargs.get("mixed_precision") == "auto":
        kwargs["mixed_precision"] = resolve_precision("auto")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not torch.cuda.is_available():
        kwargs.setdefault("cpu", True)
    accelerator = Accelerator(**kwargs)
    _fsdp_without_cuda(accelerator)
    return accelerator


def single_process_note(accelerator, environ=None, parent_cmdline: list[str] | None = None) -> str | None:
    """A line when `accelerate launch --num_processes N` (N > 1) without --multi_gpu started only this process,
    as Accelerate's simple launcher does on a machine without several GPUs: it exports MASTER_ADDR for the N
    processes (and ACCELERATE_MIXED_PRECISION, as every accelerate launch does), but no WORLD_SIZE or RANK, which
    the multi-process launcher (torchrun) sets. N is read from the launcher's command line where it can be (the
    parent process, /proc on Linux). None when nothing is amiss."""
    env = os.environ if environ is None else environ
    if accelerator.num_processes != 1 or "ACCELERATE_MIXED_PRECISION" not in env or "MASTER_ADDR" not in env \
            or "WORLD_SIZE" in env or "RANK" in env:
        return None
    if parent_cmdline is None:
        try:
            with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
                parent_cmdline = f.read().decode(errors="replace").split("\0")
        except OSError:
            parent_cmdline = []
    n = None
    for i, a in enumerate(parent_cmdline):
        for flag in ("--num_processes", "--num-processes"):
            value = a[len(flag) + 1:] if a.startswith(flag + "=") else (
                parent_cmdline[i + 1] if a == flag and i + 1 < len(parent_cmdline) else None)
            if value is not None and value.isdigit():
                n = int(value)
    asked = f"{n} processes" if n else "more than one process"
    return (f"note: accelerate launch was asked for {asked}, but without --multi_gpu it started only this one; "
            f"to run {n or 'N'} on this machine: accelerate launch --multi_gpu --num_processes {n or 'N'} train.py "
            "(on a CPU they talk over gloo).")


def _fsdp_without_cuda(accelerator: Accelerator) -> None:
    """Honour a FSDP launch (ACCELERATE_USE_FSDP=true, FSDP2) on CPU processes, where Accelerate would fall
    back to DDP without a word. Both state singletons are set: AcceleratorState copies PartialState's values."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = AcceleratorState()
    if (os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true"
            or state.distributed_type != DistributedType.MULTI_CPU):
        return
    if os.environ.get("FSDP_VERSION", "1") != "2":
        raise ConfigError("FSDP on CPU processes needs FSDP2; set fsdp_version: 2 in the accelerate config "
                          "(as configs/accelerate/fsdp.yaml does).")
    state.fsdp_plugin = FullyShardedDataParallelPlugin()  # reads the launcher's FSDP_* variables
    if state.mixed_precision != "no":  # what Accelerate does for its own FSDP: a MixedPrecisionPolicy
        state.fsdp_plugin.set_mixed_precision(state.mixed_precision)
    state.distributed_type = PartialState().distributed_type = DistributedType.FSDP


def check_options(args, positive: tuple[str, ...] = (), out: str = "out") -> None:
    """The script options every front-end shares: counts that must be at least 1 (None: the default) and an
    output folder that must not be an existing file. Raises ConfigError (one sentence) before anything is written."""

    for name in positive:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {value}.")
    folder = getattr(args, out, None)
    if folder and Path(folder).exists() and not Path(folder).is_dir():
        raise ConfigError(f"--{out} {folder} is an existing file; pass a folder to write the results into.")


# --- what the machine has -----------------------------------------------------------------------------------


def machine_cpus() -> int:
    """CPUs this process may run on, shared by the processes of this node (a launcher's LOCAL_WORLD_SIZE):
    the affinity mask, which containers and `taskset` narrow, not os.cpu_count()."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cpus = os.cpu_count() or 1
    return max(1, cpus // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))


def resolve_workers(value: int | str, cpus: int | None = None, gpu: bool | None = None) -> int:
    """Loader processes for `data.num_workers`: a number is kept; auto is, per training process, up to 8 beside a
    GPU (which leaves the CPUs to decoding: CPUs - 1) and a quarter of the CPUs on a CPU, where the model needs them:
    2 CPUs -> 1 worker, 8 -> 2; one CPU -> 0 (load in the main process)."""
    if value != "auto":
        return int(value)
    cpus = machine_cpus() if cpus is None else cpus
    gpu = torch.cuda.is_available() if gpu is None else gpu
    if cpus < 2:
        return 0
    return min(8, cpus - 1) if gpu else max(1, min(8, cpus // 4))


def resolve_threads(value: int | str, workers: int, cpus: int | None = None) -> int:
    """torch threads for `run.num_threads`: a number is kept; auto is this process's CPUs minus one per loader
    worker (each worker runs one thread), at least 1, so that no two threads share a core."""
    if value != "auto":
        return int(value)
    cpus = machine_cpus() if cpus is None else cpus
    return max(1, cpus - workers)


def resolve_precision(value: str | None, gpu_bf16: bool | None = None) -> str | None:
    """`run.mixed_precision`: auto is bf16 on a GPU that supports it (Ampere and later) and no elsewhere (fp16
    needs loss scaling; on a CPU, even one with AMX, bf16 autocast slows a small model's step: its small matrices
    pay more for the casts than they save); other values are kept."""
    if value != "auto":
        return value
    if gpu_bf16 is None:
        gpu_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return "bf16" if gpu_bf16 else "no"


def apply_machine_defaults(cfg: Config) -> Config:
    """`cfg` with data.num_workers, run.num_threads and run.mixed_precision resolved where they say auto, and
    torch's thread count set to run.num_threads, whatever the launcher set (OMP_NUM_THREADS): one split for every
    way to start a run, so results and speed do not depend on the launcher. The saved config holds the numbers."""
    import dataclasses

    workers = resolve_workers(cfg.data.num_workers)
    threads = resolve_threads(cfg.run.num_threads, workers)
    torch.set_num_threads(threads)
    data = dataclasses.replace(cfg.data, num_workers=workers)
    run = dataclasses.replace(cfg.run, num_threads=threads, mixed_precision=resolve_precision(cfg.run.mixed_precision))
    return dataclasses.replace(cfg, data=data, run=run)
