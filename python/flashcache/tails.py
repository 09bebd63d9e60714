"""The keys' tails: what the prompt's queries say about each key (include/flashcache/query_tail.hpp).

The tail of a key is the largest causal attention probability any fed query gives it. An
engine feeds its prompt's queries in chunks as it prefills; the tails are then mixed into
the score with ``Options.with_query_tail()`` and ``compress(..., tails=...)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _arrays, _core
from .options import QueryTailOptions

Array = Any


class TailAccumulator:
    """Raises a layer's tails [kv_heads, tokens] (float32, in place) chunk by chunk.

    The accumulator keeps its scratch buffers between calls; chunks merge by the maximum,
    in any order.
    """

    def __init__(self) -> None:
        self._acc = _core.TailAccumulator()

    def add(
        self,
        q: Array,
        first: int,
        k: Array,
        tails: Array,
        options: QueryTailOptions | None = None,
        *,
        lse: Array | None = None,
        layout: str = "hnd",
    ) -> None:
        """Queries q of positions [first, first + chunk) against keys k (at least first + chunk tokens).

        q: [q_heads, chunk, head_dim] ("hnd") or [chunk, q_heads, head_dim] ("nhd"), query head g
        reading KV head g // (q_heads / kv_heads). ``lse``: the queries' log-sum-exp
        [q_heads, chunk] as FlashAttention returns it (computed here when absent).
        """
        if _arrays.framework(tails, "tails") is _core.Framework.numpy and not tails.flags.writeable:
            raise ValueError("tails: the array is read-only; the tails are raised in place")
        self._acc.add(
            _arrays.readable(q, "q"),
            int(first),
            _arrays.readable(k, "k"),
            tails,
            None if lse is None else _arrays.readable(lse, "lse"),
            (options or QueryTailOptions())._to_core(),
            _arrays.layout(layout),
        )


def query_tails(
    q: Array, k: Array, options: QueryTailOptions | None = None, *, first: int = 0, layout: str = "hnd"
) -> np.ndarray:
    """The tails [kv_heads, tokens] of k from the queries q of positions [first, first + chunk), in one pass.

    ``options`` defaults to the chosen feed, the prompt's last 256 queries
    (``QueryTailOptions.last_queries(tokens)``).
    """
    lay = _arrays.layout(layout)
    heads, tokens = (k.shape[0], k.shape[1]) if lay is _core.Layout.hnd else (k.shape[1], k.shape[0])
    tails = np.zeros((heads, tokens), dtype=np.float32)
    TailAccumulator().add(q, first, k, tails, options or QueryTailOptions.last_queries(tokens), layout=layout)
    return tails
