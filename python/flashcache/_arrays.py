"""The door's checks on what comes in, before C++ sees it: the kind of array, its layout, the arguments beside."""

from __future__ import annotations

import math
import numbers
import os
from typing import Any

from . import _core


def framework(x: Any, name: str) -> _core.Framework:
    """Which framework `x` belongs to, so that results come back in it; a TypeError for anything else."""
    kind = type(x)
    if kind.__module__ == "torch" and kind.__name__ in ("Tensor", "Parameter"):
        return _core.Framework.torch
    if kind.__module__ == "numpy" and kind.__name__ == "ndarray":
        return _core.Framework.numpy
    raise TypeError(f"{name}: expected a numpy array or a torch tensor, got {kind.__module__}.{kind.__name__}")


def readable(x: Any, name: str) -> Any:
    """`x` as the C++ door takes it: a torch tensor that requires grad is detached (a view, no copy)."""
    fw = framework(x, name)
    if fw is _core.Framework.torch and x.requires_grad:
        return x.detach()
    return x


def on_cuda(x: Any) -> bool:
    """Whether `x` is a torch tensor in CUDA memory (the GPU door's input)."""
    return framework(x, "k") is _core.Framework.torch and x.device.type == "cuda"


def layout(value: str) -> _core.Layout:
    if value not in ("hnd", "nhd"):
        raise ValueError(
            f"layout {value!r} is not 'hnd' ([heads, tokens, head_dim]) or 'nhd' ([tokens, heads, head_dim])"
        )
    return _core.Layout.hnd if value == "hnd" else _core.Layout.nhd


def budget(keep: Any) -> _core.Budget:
    """A float is a ratio of the tokens, an int a count per head; anything else is refused by name."""
    if isinstance(keep, bool):
        raise TypeError("keep: a bool is neither a ratio (float) nor a token count (int)")
    if isinstance(keep, numbers.Integral):
        return _core.Budget.tokens(int(keep))
    if isinstance(keep, numbers.Real):
        ratio = float(keep)
        if not math.isfinite(ratio) or not 0.0 <= ratio <= 1.0:
            raise ValueError(f"keep ratio {ratio} is outside [0, 1]")
        return _core.Budget.ratio(ratio)
    raise TypeError(f"keep: expected a ratio (float) or a token count (int), got {type(keep).__name__}")


def spans(value: Any) -> list[tuple[int, int, int]]:
    """Image spans as (first token, rows, cols) triples."""
    if value is None:
        return []
    out = []
    for s in value:
        first, rows, cols = (int(x) for x in s)
        out.append((first, rows, cols))
    return out


def threads(count: int | None) -> int:
    """Threads for the C++ scoring: ``count``, or every CPU of the machine when None."""
    return (os.cpu_count() or 1) if count is None else count
