"""Preemption: SIGTERM, what Slurm and Kubernetes send a job before they kill it, stops training at the next
optimizer-step boundary with a resumable state saved, instead of killing it with up to an epoch lost.

While the loop runs (`deferred()`), the handler only notes the signal: the step, state save or evaluation under
way finishes (a step is applied whole, a save is atomic anyway), and the loop asks `requested()` after each
optimizer step and after each epoch's checkpoints. Every process answers the same (one max over processes of one
number per step when there are several), one state is saved at that step, and `Preempted` carries one line to
`run_cli`, which exits with 143 (128 + SIGTERM, what a shell reports for a terminated job). A signal on the
step that ends an epoch is honoured after that epoch's evaluation and its state save. Outside the loop (reading
data, building the model, drawing curves) there is nothing new to save and SIGTERM stops at once.
A forked loader worker inherits the handler and ignores the signal (a job's whole process group receives it);
the main process ends its workers itself.
"""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager

__all__ = ["Preempted", "install", "deferred", "requested", "EXIT_CODE"]

EXIT_CODE = 128 + signal.SIGTERM  # 143
_STATE = {"pid": None, "requested": False, "deferring": False}


class Preempted(BaseException):
    """SIGTERM was received; the message says what was saved. A BaseException, as KeyboardInterrupt: no
    `except Exception` on its way up swallows it."""


def _handler(signum, frame) -> None:
    if os.getpid() != _STATE["pid"]:  # a forked loader worker: its parent decides
        return
    _STATE["requested"] = True
    if not _STATE["deferring"]:
        raise Preempted("")


def _early_handler(signum, frame) -> None:
    if os.getpid() != _STATE["pid"]:
        return
    if os.environ.get("RANK", "0") == "0":
        print("terminated (SIGTERM) while starting; nothing was saved.", file=sys.stderr)
    raise SystemExit(EXIT_CODE)


def install(early: bool = False) -> None:
    """Route SIGTERM to the handler (from the main thread, before the training starts). `early`: while the
    script still imports, before run_cli can turn Preempted into its line: say it and exit 143 directly."""
    _STATE.update(pid=os.getpid(), requested=False)
    signal.signal(signal.SIGTERM, _early_handler if early else _handler)


@contextmanager
def deferred():
    """Within: SIGTERM is noted, not raised; the loop polls `requested()` at consistent points."""
    previous, _STATE["deferring"] = _STATE["deferring"], True
    try:
        yield
    finally:
        _STATE["deferring"] = previous


def requested(accelerator=None) -> bool:
    """Whether any process has received SIGTERM; with several processes a collective, so every process must
    call it at the same point."""
    flag = bool(_STATE["requested"])
    if accelerator is not None and accelerator.num_processes > 1:
        import torch

        flags = accelerator.gather(torch.tensor([float(flag)], device=accelerator.device))
        flag = bool(flags.max().item() > 0)
    return flag
