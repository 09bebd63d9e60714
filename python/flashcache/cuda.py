"""CUDA tensors through flashcache's GPU front door (flashcache/cuda/compress.cuh).

    import torch, flashcache.cuda
    model = flashcache.cuda.compress_model(ks, vs, keep=0.2)  # ks, vs: per-layer CUDA tensors
    model.layers[0].kept, model.layers[0].k                   # on the tensors' device

Built only when the package was built with its CUDA door (``flashcache.has_cuda``; docs/PYTHON.md:
``pip install . -C cmake.define.FLASHCACHE_PYTHON_CUDA=ON``). Every device array comes from
torch's allocator, the pipeline's workspace too; the run goes on the stream given (torch's
current stream by default) and the call waits for it, so results are ready when it returns.
The kept rows are gathered into K'/V' by torch on the same stream. Scores stay on the device
(``scores`` is None) and non-finite rows are not counted (``nonfinite`` is None).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import _arrays
from .compress import CompressedLayer, CompressedModel
from .options import Options

try:
    from . import _cuda
except ImportError as error:  # not built, or the CUDA libraries cannot be loaded
    _cuda = None
    _missing = str(error)


def device_count() -> int:
    """CUDA devices this process sees through the door; 0 without a driver, a device or the door."""
    return 0 if _cuda is None else _cuda.device_count()


def available() -> bool:
    """Whether CUDA tensors can be compressed here: the door is built and a device is present."""
    return device_count() > 0


def _require_door() -> Any:
    if _cuda is None:
        raise RuntimeError(
            "flashcache was built without its CUDA door (flashcache._cuda: "
            f"{_missing}); rebuild with -C cmake.define.FLASHCACHE_PYTHON_CUDA=ON, or pass .cpu() tensors"
        )
    return _cuda


def _gather(x: Any, kept: Any, hnd: bool) -> Any:
    """Rows `kept` [heads, n] of one layer's K or V, as [heads, n, head_dim]."""
    rows = x if hnd else x.transpose(0, 1)
    return rows.gather(1, kept[:, :, None].expand(-1, -1, rows.shape[2]))


def compress_model(
    k: Sequence[Any],
    v: Sequence[Any],
    keep: float | int = 0.2,
    options: Options | None = None,
    *,
    layout: str = "hnd",
    stream: Any = None,
) -> CompressedModel:
    """Compresses a model whose per-layer K and V are CUDA tensors of one sequence, on the GPU.

    The same call as :func:`flashcache.compress_model` (float32, float16 or bfloat16, either
    layout, every layer one shape) with the library's per-head keep sets; ``stream`` is a
    ``torch.cuda.Stream`` (default: the current one of the tensors' device). Results are on
    the device: ``kept`` [heads, budget] int64, K'/V' [heads, budget, head_dim]; the budgets
    and energy ratios are small host tensors.
    """
    import torch

    door = _require_door()
    if len(k) == 0:
        raise ValueError("compress_model: no layers")
    ks = [_arrays.readable(x, "k") for x in k]
    vs = [_arrays.readable(x, "v") for x in v]
    device = ks[0].device
    if device.type != "cuda":
        raise ValueError(f"k[0] is on {device}, not a CUDA device (CPU tensors: flashcache.compress_model)")
    _arrays.layout(layout)  # a bad name is refused here
    hnd = layout == "hnd"
    if ks[0].dim() != 3:
        raise ValueError(f"k[0]: expected 3 dimensions, got shape {tuple(ks[0].shape)}")
    heads, tokens = (ks[0].shape[0], ks[0].shape[1]) if hnd else (ks[0].shape[1], ks[0].shape[0])
    layers = len(ks)
    run_stream = torch.cuda.current_stream(device) if stream is None else stream
    with torch.cuda.device(device), torch.cuda.stream(run_stream):
        kept = torch.empty((layers, heads, tokens), dtype=torch.int32, device=device)
        kept_indptr = torch.empty((layers, 2), dtype=torch.int32, device=device)
        ratio = torch.empty((layers,), dtype=torch.float32, device=device)

        def allocate(nbytes: int) -> Any:
            return torch.empty((max(nbytes, 1),), dtype=torch.uint8, device=device)

        door.compress_model(
            ks,
            vs,
            layout,
            _arrays.budget(keep),
            (options or Options())._to_core(),
            run_stream.cuda_stream,
            device.index,
            allocate,
            kept,
            kept_indptr,
            ratio,
        )
        budgets = kept_indptr[:, 1].to(torch.int64).cpu()
        ratios = ratio.to(torch.float64).cpu()
        out = []
        for layer in range(layers):
            rows = kept[layer, :, : int(budgets[layer])].to(torch.int64)
            out.append(
                CompressedLayer(
                    rows, _gather(ks[layer], rows, hnd), _gather(vs[layer], rows, hnd), None, float(ratios[layer]), None
                )
            )
    return CompressedModel(out, budgets, ratios, None)
