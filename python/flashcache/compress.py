"""score, compress and compress_model: the C++ front door (flashcache.hpp) from Python.

K and V are 3-D arrays of one layer, numpy or torch (CPU), float32, float16 or bfloat16, in
the layout named by ``layout``: ``"hnd"`` is [heads, tokens, head_dim], ``"nhd"`` is
[tokens, heads, head_dim]. They are read in place (no copy) whenever the head dim is
contiguous, whatever the other strides: a slice of a bigger cache, ``cache[0]`` of a
[batch, heads, tokens, dim] tensor, or a transpose. Results come back in the inputs'
framework; K'/V' are always [heads, budget, head_dim].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import _arrays, _core
from .options import Options, ScoreOptions, SharedKeepOptions

Array = Any  # a numpy.ndarray or a torch.Tensor


@dataclass
class Scores:
    """One layer's outlier scores [heads, tokens] (float32; +inf marks a non-finite token)."""

    score: Array
    energy: Array  # [heads, 4] float64: E(K), E_high(K), E(V), E_high(V)
    energy_ratio: float  # R_l, what the layer allocator splits the budget by
    nonfinite: int  # (head, token) rows holding a NaN or infinity


@dataclass
class CompressedLayer:
    """One compressed layer: ``kept`` [heads, budget] ascending token indices, K'/V' [heads, budget, head_dim]."""

    kept: Array
    k: Array
    v: Array
    scores: Array | None  # [heads, tokens] float32; None from the GPU door (they stay on the device)
    energy_ratio: float
    nonfinite: int | None  # (head, token) rows holding a NaN or infinity; None where not counted (GPU door)

    @property
    def budget(self) -> int:
        """Tokens kept per head."""
        return int(self.kept.shape[1])


@dataclass
class CompressedModel:
    """A compressed model: its layers, each layer's budget per head and energy ratio R_l."""

    layers: list[CompressedLayer]
    budgets: Array  # [layers] int64
    energy_ratio: Array  # [layers] float64
    nonfinite: int | None  # None where not counted (GPU door)

    def tokens_after(self) -> int:
        return int(sum(int(b) for b in self.budgets))


def _pair(k: Array, v: Array) -> tuple[Array, Array, _core.Framework]:
    fw = _arrays.framework(k, "k")
    if _arrays.framework(v, "v") is not fw:
        raise TypeError("k and v must both be numpy arrays or both torch tensors")
    return _arrays.readable(k, "k"), _arrays.readable(v, "v"), fw


def _tails(tails: Array | None) -> Array | None:
    return None if tails is None else _arrays.readable(tails, "tails")


def score(
    k: Array,
    v: Array,
    options: ScoreOptions | Options | None = None,
    *,
    layout: str = "hnd",
    spans: Sequence[tuple[int, int, int]] | None = None,
    tails: Array | None = None,
    keep: float = 1.0,
) -> Scores:
    """Each token's outlier score: its deviation from the layer's DCT base (stage 1 alone).

    ``options``: a ScoreOptions, or the Options whose ``score`` part is read. ``tails``: the
    keys' tails [heads, tokens] (float32), read when ``options.query`` is ``tail``. ``keep``: the
    share of the tokens the caller will keep, which ``mean_weight`` follows between
    ``mean_zero_keep`` and ``mean_full_keep`` (by default none at 0.25 and below, in full at 0.5
    and above; 1: as if nothing were dropped). ``compress`` passes its own.
    """
    if isinstance(options, Options):
        options = options.score
    k, v, fw = _pair(k, v)
    s, energy, ratio, nonfinite = _core.score(
        k,
        v,
        _arrays.layout(layout),
        (options or ScoreOptions())._to_core(),
        _arrays.spans(spans),
        _tails(tails),
        keep,
        fw,
    )
    return Scores(s, energy, ratio, nonfinite)


def compress(
    k: Array,
    v: Array,
    keep: float | int = 0.2,
    options: Options | None = None,
    *,
    layout: str = "hnd",
    mask: Array | None = None,
    spans: Sequence[tuple[int, int, int]] | None = None,
    tails: Array | None = None,
) -> CompressedLayer:
    """Compresses one layer: every head keeps ``keep`` tokens (a ratio of the layer's, or a count).

    The protected tokens (``options.select``: the first 4 and a recent window of half the
    budget by default) count toward it; the rest go to the highest outlier scores.
    ``mask`` [tokens] (bool or uint8) marks tokens always kept; ``spans`` are image spans
    (first token, rows, cols) scored over their 2D patch grid.
    """
    k, v, fw = _pair(k, v)
    out = _core.compress(
        k,
        v,
        _arrays.layout(layout),
        _arrays.budget(keep),
        (options or Options())._to_core(),
        None if mask is None else _arrays.readable(mask, "mask"),
        _arrays.spans(spans),
        _tails(tails),
        fw,
    )
    return CompressedLayer(*out)


def compress_model(
    k: Sequence[Array],
    v: Sequence[Array],
    keep: float | int = 0.2,
    options: Options | None = None,
    *,
    layout: str = "hnd",
    shared: SharedKeepOptions | None = None,
    masks: Sequence[Array | None] | None = None,
    spans: Sequence[tuple[int, int, int]] | None = None,
    tails: Sequence[Array | None] | None = None,
    threads: int | None = None,
) -> CompressedModel:
    """Compresses a whole model, one K and one V array per layer.

    ``keep`` is per layer (a ratio of each layer's tokens, or a count); with the default
    dynamic allocation the same total is re-split across layers in proportion to their
    high-frequency energy ratios R_l. Every head keeps its own tokens unless ``shared``
    asks for one set per layer or per sequence. ``masks`` and ``tails``: one per layer, or none.
    ``threads``: the layers are scored on this many threads (default: every CPU of the machine,
    ``os.cpu_count()``); the result does not depend on it. CUDA tensors go to the GPU front door
    (:func:`flashcache.cuda.compress_model`), which takes the options and per-head sets only.
    """
    if len(k) == 0:
        raise ValueError("compress_model: no layers")
    if _arrays.on_cuda(k[0]):
        extras = {"shared": shared, "masks": masks, "spans": spans, "tails": tails}
        given = [name for name, value in extras.items() if value]
        if given:
            raise ValueError(
                f"CUDA tensors: the GPU door takes no {', '.join(given)} yet (pass .cpu() tensors for them)"
            )
        from . import cuda

        return cuda.compress_model(k, v, keep, options, layout=layout)
    if len(k) != len(v):
        raise ValueError(f"{len(k)} K layers but {len(v)} V layers")
    pairs = [_pair(kl, vl) for kl, vl in zip(k, v)]
    fws = {fw for _, _, fw in pairs}
    if len(fws) > 1:
        raise TypeError("the layers mix numpy arrays and torch tensors")
    shared_core = (shared or SharedKeepOptions(keep_set="per_head"))._to_core()
    layers, budgets, ratios, nonfinite = _core.compress_model(
        [p[0] for p in pairs],
        [p[1] for p in pairs],
        _arrays.layout(layout),
        _arrays.budget(keep),
        (options or Options())._to_core(),
        shared_core,
        [] if masks is None else [None if m is None else _arrays.readable(m, "masks") for m in masks],
        _arrays.spans(spans),
        [] if tails is None else [_tails(t) for t in tails],
        _arrays.threads(threads),
        pairs[0][2],
    )
    return CompressedModel([CompressedLayer(*layer) for layer in layers], budgets, ratios, nonfinite)
