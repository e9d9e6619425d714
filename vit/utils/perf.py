"""Performance measurement shared by benchmark.py and scripts/gpu_check.py: FLOP counting that also sees CPU
flash attention, and the matmul peak that utilization (MFU) is measured against.

PyTorch's `FlopCounterMode` knows the CUDA SDPA kernels but not `_scaled_dot_product_flash_attention_for_cpu`
(nor its backward), so on CPU it would silently drop the attention matmuls (~14% of ViT-Ti's FLOPs at 224 px).
`flop_counter()` adds them with PyTorch's own SDPA formulas. A multiply-add counts as 2 FLOPs.
"""

from __future__ import annotations

import time

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

__all__ = ["flop_counter", "count_flops", "sync", "matmul_peak"]

_aten = torch.ops.aten


def _cpu_flash(query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_flash_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


# FlopCounterMode hands these the argument shapes (it wraps plain functions in its shape_wrapper).
_CPU_SDPA = {
    _aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward,
}


def flop_counter(display: bool = False) -> FlopCounterMode:
    return FlopCounterMode(display=display, custom_mapping=_CPU_SDPA)


def count_flops(fn) -> int:
    """FLOPs of calling `fn()` (forward, or forward and backward if `fn` runs one)."""
    with flop_counter() as counter:
        fn()
    return counter.get_total_flops()


def sync(device: torch.device | str) -> None:
    """Wait for the work queued on `device` (CUDA runs asynchronously; a timer read before this lies)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(device: torch.device | str, dtype: torch.dtype, n: int, reps: int = 10, warmup: int = 2) -> float:
    """FLOP/s of an n x n matmul in `dtype` on `device`, the best of `reps` after `warmup` untimed ones: the
    practical peak for dense layers, which utilization is measured against in the same run (2 n^3 FLOPs)."""
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(warmup):
        a @ b
    best = float("inf")
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best
