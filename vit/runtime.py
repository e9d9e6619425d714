"""What the scripts share at run time: the Accelerator, and turning user errors into one clear line.

Accelerate only picks its multi-process CPU mode (gloo) when asked for the CPU explicitly; started by
`accelerate launch --multi_gpu --num_processes 2` on a machine without CUDA, each process would otherwise
believe it is alone and evaluate everything twice. `make_accelerator` asks for the CPU in exactly that case.
Accelerate (1.15) also turns FSDP on only for accelerators: launched with configs/accelerate/fsdp.yaml on a
CPU-only machine it would silently train plain DDP instead. torch's FSDP2 (`fully_shard`) runs on gloo, so
`make_accelerator` switches the state to FSDP there (CI and the tests train the FSDP path on CPU).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from accelerate import Accelerator

from .config import ConfigError

__all__ = ["make_accelerator", "run_cli", "check_options"]


def run_cli(main: Callable[[], int], interrupt_note: Callable[[], str] | None = None) -> None:
    """Run a script's `main()` and exit with its code. A user's mistake (our errors are ValueErrors: config,
    data, checkpoint), a missing file or a non-finite loss becomes one line on stderr and exit code 2; Ctrl-C
    one line saying what was kept (`interrupt_note()`), exit code 130 as a shell reports it."""
    try:
        code = main()
    except (ValueError, FileNotFoundError, FloatingPointError) as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        note = interrupt_note() if interrupt_note is not None else "files already written are complete"
        print(f"interrupted (Ctrl-C); {note}.", file=sys.stderr)
        code = 130
    sys.exit(code)


def make_accelerator(**kwargs) -> Accelerator:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not torch.cuda.is_available():
        kwargs.setdefault("cpu", True)
    accelerator = Accelerator(**kwargs)
    _fsdp_without_cuda(accelerator)
    return accelerator


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
