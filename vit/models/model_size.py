"""How big a model would be, known before any of its tensors exist, and the bound every builder holds it to.

A model is counted by building its skeleton on PyTorch's meta device (shapes only: no memory, no initial values),
every long repeated stack cut to one copy, then to two: the blocks of a stack all have the same shapes (a ViT's
`depth` blocks, a ResNetV2 stage's bottlenecks), so the count at n copies is the count at one plus n - 1 times
the difference (a 10**7-block config costs two small builds, not 10**7 modules). Everything the constructor makes
is counted, whatever option made it (register tokens, a relative-position MLP, an attention-pooling head, a stem,
rotary tables), buffers too (a relative-position index holds (h w)^2 entries per block), so a new option needs
no formula here. tests/test_model_size.py holds the count equal to the built model's over a sample of
architectures.

    n = stacked_size(lambda c: TextEncoder(**{**kwargs, "depth": c["depth"]}), {"depth": kwargs["depth"]})
    check_size(n, "the text tower", "width 64, depth 2", "lower contrastive.text_width")
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

__all__ = ["MAX_PARAMS", "check_size", "entries", "shown_size", "stacked_size", "text_size"]

MAX_PARAMS = 10**10  # 40 GB in float32: a model past this is a typo or a hostile config.json, not a model to build


def entries(module: nn.Module) -> int:
    """The numbers `module` holds: its parameters' and buffers' elements."""
    return sum(p.numel() for p in module.parameters()) + sum(b.numel() for b in module.buffers())


class _NoValues(TorchFunctionMode):
    """In-place writes into meta tensors skipped (normal_, uniform_, fill_, copy_: initial values): a meta tensor
    holds none, and torch's meta kernel for normal_ imports torch._dynamo (seconds, once per process)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        target = args[0] if args else next(iter(kwargs.values()), None)  # nn.init passes tensor= by name
        if name.endswith("_") and not name.startswith(("_", "resize", "set_", "as_strided")) \
                and isinstance(target, torch.Tensor) and target.is_meta:
            return target
        return func(*args, **kwargs)


def _meta_size(build: Callable[[], nn.Module]) -> float | None:
    """entries(build()) with the build on the meta device; inf where a size overflows torch's 64-bit sizes; None
    where the build refuses its arguments (the real build then raises its own sentence)."""
    try:
        with torch.device("meta"), _NoValues():
            return entries(build())
    except OverflowError:  # e.g. int(D * 1e308)
        return math.inf
    except (TypeError, RuntimeError, ValueError) as e:  # torch: "Overflow when unpacking long", "overflowed"
        return math.inf if "overflow" in str(e).lower() else None


def stacked_size(build: Callable[[dict[str, int]], nn.Module], counts: dict[str, int], keep: int = 16
                 ) -> float | None:
    """The entries of `build(counts)`, where each count (a depth, the blocks of one stage) repeats blocks of one
    shape, without building it: the meta skeleton with the counts up to `keep` as they are and the others at 1,
    then once per larger count at 2, extrapolated. None when the arguments are not ones the builder takes."""
    if not all(type(n) is int and n >= 0 for n in counts.values()):
        return None  # a depth of 2.5 or "12": the real build names it
    cut = {k: n if n <= keep else 1 for k, n in counts.items()}
    base = _meta_size(lambda: build(cut))
    if base is None or math.isinf(base):
        return base
    total = base
    for key, n in counts.items():
        if n > keep:
            two = _meta_size(lambda key=key: build({**cut, key: 2}))
            if two is None or math.isinf(two):
                return two
            total += (n - 1) * (two - base)
    return total


def text_size(kwargs: dict) -> float | None:
    """The entries `TextEncoder(**kwargs)` would allocate (stacked_size over its depth)."""
    from .text_encoder import TextEncoder

    return stacked_size(lambda n: TextEncoder(**{**kwargs, "depth": n["depth"]}), {"depth": kwargs.get("depth")})


def shown_size(n: float) -> str:
    return f"about {n:.2g}" if math.isfinite(n) else "over 1e+308"


def check_size(n: float | None, what: str, shown: str, advice: str) -> None:
    """ValueError, one sentence, when `n` entries (stacked_size's) pass MAX_PARAMS; None (not counted) passes."""
    if n is not None and not n <= MAX_PARAMS:  # `not <=`: NaN passes no bound
        raise ValueError(f"{what} would have {shown_size(n)} parameters (buffers included), more than "
                         f"{MAX_PARAMS:.0e} ({shown}); {advice}.")
