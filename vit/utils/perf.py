"""FLOP counting that also sees CPU flash attention.

PyTorch's `FlopCounterMode` knows the CUDA SDPA kernels but not `_scaled_dot_product_flash_attention_for_cpu`
(nor its backward), so on CPU it would silently drop the attention matmuls (~14% of ViT-Ti's FLOPs at 224 px).
`flop_counter()` adds them with PyTorch's own SDPA formulas. A multiply-add counts as 2 FLOPs.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

__all__ = ["flop_counter", "count_flops"]

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
