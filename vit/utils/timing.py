"""Interleaved timing: every contender timed in turn (A, B, C, A, B, C, ...) after warm-up, so that a shared
machine's changing load falls on each alike, and ratios taken per paired repeat (one repeat of A against the
repeat of B beside it) with their median and min-max spread. benchmark.py's modes and
`vit.deploy.quantize.speed_ratios` time this way. Standard library only (a device's sync is passed in)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Timings", "interleaved", "ratio_stats"]


@dataclass
class Timings:
    """Seconds per call of each contender, one entry per repeat: `wall` by the clock, `cpu` in the calling
    thread's CPU time (with one compute thread, the time it computed without the waits for a core of a loaded
    machine; with more threads it leaves the other threads out, so it is only read at one thread)."""

    wall: dict[str, list[float]]
    cpu: dict[str, list[float]]


def interleaved(calls: dict[str, Callable[[], object]], warmup: int, repeats: int, iters: int = 1,
                sync: Callable[[], object] | None = None) -> Timings:
    """Time each of `calls` `repeats` times, in turn, after `warmup` untimed calls of each; one repeat is the mean
    of `iters` calls. `sync` (e.g. `torch.cuda.synchronize`) runs before and after each repeat, so that
    asynchronous devices have finished what the clock measures."""
    sync = sync or (lambda: None)
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    wall: dict[str, list[float]] = {k: [] for k in calls}
    cpu: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(repeats):
        for k, fn in calls.items():
            sync()
            t, c = time.perf_counter(), time.thread_time()
            for _ in range(iters):
                fn()
            sync()
            wall[k].append((time.perf_counter() - t) / iters)
            cpu[k].append((time.thread_time() - c) / iters)
    return Timings(wall, cpu)


def ratio_stats(a: list[float], b: list[float]) -> dict:
    """b / a for each paired repeat, then median, min and max. With seconds (a: the contender, b: the reference)
    it is how many times faster the contender is; with images/s (a: the reference, b: the contender) too."""
    r = [y / max(x, 1e-12) for x, y in zip(a, b)]
    return dict(median=statistics.median(r), min=min(r), max=max(r))
