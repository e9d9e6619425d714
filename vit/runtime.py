"""The Accelerator the scripts share.

Accelerate only picks its multi-process CPU mode (gloo) when asked for the CPU explicitly; started by
`accelerate launch --multi_gpu --num_processes 2` on a machine without CUDA, each process would otherwise
believe it is alone and evaluate everything twice. `make_accelerator` asks for the CPU in exactly that case.
"""

from __future__ import annotations

import os

import torch
from accelerate import Accelerator

__all__ = ["make_accelerator"]


def make_accelerator(**kwargs) -> Accelerator:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not torch.cuda.is_available():
        kwargs.setdefault("cpu", True)
    return Accelerator(**kwargs)
