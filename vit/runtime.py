"""What the scripts share at run time: the Accelerator, and turning user errors into one clear line.

Accelerate only picks its multi-process CPU mode (gloo) when asked for the CPU explicitly; started by
`accelerate launch --multi_gpu --num_processes 2` on a machine without CUDA, each process would otherwise
believe it is alone and evaluate everything twice. `make_accelerator` asks for the CPU in exactly that case.
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
    return Accelerator(**kwargs)


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
