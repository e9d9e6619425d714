"""What every benchmark mode measures a model with: a `Side` (a model, its optimizer and its step functions at a
precision), counted FLOPs, the activation memory autograd keeps for backward (with and without gradient
checkpointing), the CUDA allocator's peak and the attention kernel the profiler saw."""

from __future__ import annotations

import os
from contextlib import nullcontext

import torch

from ..utils import perf
from ..utils.perf import count_flops, sync

__all__ = ["KERNELS", "Side", "autocast", "matmul_peak", "side_flops", "saved_activation_bytes",
           "checkpointed_activation_bytes", "cuda_peak_mib", "attention_kernels", "device_sync"]

# profiler op name -> the kernel it means
KERNELS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_flash_attention_forward": "flash",
    "aten::_scaled_dot_product_efficient_attention": "memory-efficient",
    "aten::_efficient_attention_forward": "memory-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cuDNN",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_softmax": "explicit softmax",
}


def autocast(device: torch.device, precision: str):
    """torch.autocast at "bf16" or "fp16"; nothing at "fp32"."""
    if precision == "fp32":
        return nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def device_sync(device: torch.device):
    """A no-argument sync for `vit.utils.timing.interleaved`: the device's queue drained."""
    return lambda: sync(device)


def matmul_peak(device: torch.device, precision: str, n: int = 2048, reps: int = 10) -> float:
    """FLOP/s of a large square matmul at `precision`, the practical peak for dense layers on this device."""
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    if device.type == "cpu" and precision != "fp32":
        dtype = torch.float32  # autocast on CPU still multiplies most matrices in fp32 on machines without AMX
    return perf.matmul_peak(device, dtype, max(n, 8192) if device.type == "cuda" else n, reps)


class Side:
    """One model (ours or timm's) with its optimizer and step functions."""

    def __init__(self, name: str, model: torch.nn.Module, optimizer, device, precision: str) -> None:
        self.name, self.model, self.opt, self.device, self.precision = name, model, optimizer, device, precision

    def infer(self, x):
        self.model.eval()
        with torch.inference_mode(), autocast(self.device, self.precision):
            self.model(x)

    def train_step(self, x, y):
        self.model.train()
        with autocast(self.device, self.precision):
            loss = torch.nn.functional.cross_entropy(self.model(x).float(), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def side_flops(side: Side, x, mode: str) -> int:
    """FLOPs per image of one inference or one forward+backward, counted on a single image."""
    if mode == "inference":
        with torch.no_grad():
            return count_flops(lambda: side.model(x[:1]))

    def once():
        side.model(x[:1]).sum().backward()

    f = count_flops(once)
    side.opt.zero_grad(set_to_none=True)
    return f


def saved_activation_bytes(side: Side, x, y) -> int:
    """Bytes of distinct tensors autograd keeps for backward during one training forward."""
    seen: dict[int, int] = {}

    def pack(t):
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            try:
                key = t.untyped_storage().data_ptr()
                seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
            except (RuntimeError, NotImplementedError):
                pass
        return t

    side.model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast(side.device, side.precision):
        loss = torch.nn.functional.cross_entropy(side.model(x).float(), y)
    params = {p.untyped_storage().data_ptr() for p in side.model.parameters()}
    loss.backward()
    side.opt.zero_grad(set_to_none=True)
    return sum(v for k, v in seen.items() if k not in params)


def checkpointed_activation_bytes(side: Side, x, y) -> int:
    """`saved_activation_bytes` with gradient checkpointing on (`model.grad_checkpointing: true`): what is kept is
    each block's input (B, N, D), held by torch.utils.checkpoint, plus what lies outside the blocks."""
    model = getattr(side.model, "_orig_mod", side.model)  # torch.compile'd: the module it wraps
    model.set_grad_checkpointing(True)
    try:
        return saved_activation_bytes(side, x, y)
    finally:
        model.set_grad_checkpointing(False)


def cuda_peak_mib(side: Side, x, y) -> float | None:
    """The CUDA allocator's peak during one training step, above what was allocated before it; None on CPU."""
    if side.device.type != "cuda":
        return None
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    side.train_step(x, y)
    sync(side.device)
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def attention_kernels(side: Side, x, y) -> list[str]:
    """The attention kernels (KERNELS' labels) the profiler saw in one training step."""
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                    if side.device.type == "cuda" else [])
    # the profiler's native library (kineto) logs 'profiler_start' and, without a GPU, 'gpuGetDeviceCount failed'
    # to stderr; level 6 silences it (read when the profiler starts, so setting it here is in time)
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with torch.profiler.profile(activities=acts) as prof:
        side.train_step(x, y)
    names = {e.key for e in prof.key_averages()}
    return sorted({label for op, label in KERNELS.items() if op in names})
