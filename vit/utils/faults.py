"""Test-only fault injection: make a training fail at an exact place, as a crash or a bad batch would.

The crash-safety tests set `VIT_FAULT_INJECT` for one child process; nothing sets it otherwise, and every hook
is a no-op (one environment lookup) without it. Values:

    <point>:<n>         SIGKILL at `fault_point(point, n)` (a crash, the OOM killer): step, state, checkpoint
    sigint@<point>:<n>  SIGINT there instead (Ctrl-C)
    sigterm@<point>:<n> SIGTERM there instead (a preemption: Slurm, Kubernetes)
    nan:<step>          the loss of optimizer step <step> becomes NaN (`poison_loss`)
"""

from __future__ import annotations

import os
import signal

FAULT_ENV = "VIT_FAULT_INJECT"

__all__ = ["FAULT_ENV", "fault_point", "poison_loss"]


def fault_point(point: str, n: int) -> None:
    """Die abruptly (SIGKILL) or be interrupted (SIGINT, SIGTERM) when VIT_FAULT_INJECT names this point and count."""
    value = os.environ.get(FAULT_ENV)
    if value == f"{point}:{n}":
        os.kill(os.getpid(), signal.SIGKILL)
    if value == f"sigint@{point}:{n}":
        os.kill(os.getpid(), signal.SIGINT)
    if value == f"sigterm@{point}:{n}":
        os.kill(os.getpid(), signal.SIGTERM)


def poison_loss(loss, step: int):
    """`loss` times NaN when VIT_FAULT_INJECT is `nan:<step>` (a numerical fault at a known step), else `loss`."""
    if os.environ.get(FAULT_ENV) == f"nan:{step}":
        return loss * float("nan")
    return loss
