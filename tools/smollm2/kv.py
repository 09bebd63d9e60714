"""The per-layer KV cache of the model, which may be compressed per layer and per KV head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np


@dataclass
class KVCache:
    """Per-layer keys (after RoPE) and values, each ``[H_kv, M_l, d]`` float32.

    ``M_l`` may differ between layers (per-layer budgets). Within a layer, each KV head
    may hold a *different* subset of the original tokens (per-head selection); the arrays
    store the vectors themselves, so no index bookkeeping is needed for attention.
    ``next_position`` is the RoPE position of the next token to be fed: the length of the
    *uncompressed* sequence, which compression does not change.

    ``bias`` (optional): per layer ``[H_kv, M_l]`` float32 added to the cached tokens'
    attention logits, 0 or -inf: heads that keep different numbers of tokens share one
    array, the shorter ones padded with masked slots (``ragged``).
    """
    k: List[np.ndarray]
    v: List[np.ndarray]
    next_position: int
    bias: Optional[List[np.ndarray]] = None

    @property
    def lengths(self) -> List[int]:
        return [k.shape[1] for k in self.k]

    def gather(self, keep: Sequence[np.ndarray]) -> "KVCache":
        """A compressed copy keeping, in layer l and KV head h, tokens ``keep[l][h]``.

        ``keep[l]`` is an integer array ``[H_kv, B_l]`` (or ``[B_l]``, the same tokens for
        every head) of indices into this cache's token axis; keep them sorted to
        preserve the original order (the order does not change attention outputs).
        """
        ks, vs, bias = [], [], None if self.bias is None else []
        for l, idx in enumerate(keep):
            idx = np.asarray(idx, dtype=np.int64)
            if idx.ndim == 1:
                idx = np.broadcast_to(idx, (self.k[l].shape[0], idx.shape[0]))
            ks.append(np.take_along_axis(self.k[l], idx[:, :, None], axis=1))
            vs.append(np.take_along_axis(self.v[l], idx[:, :, None], axis=1))
            if bias is not None:
                bias.append(np.take_along_axis(self.bias[l], idx, axis=1))
        return KVCache(ks, vs, self.next_position, bias)

    def ragged(self, keep: Sequence[Sequence[np.ndarray]]) -> "KVCache":
        """Like ``gather``, but ``keep[l][h]`` may hold a different number of tokens per
        head: the shorter heads are padded with masked slots (``bias`` -inf)."""
        if self.bias is not None:
            raise ValueError("ragged: the cache is ragged already")
        idx, bias = [], []
        for heads in keep:
            width = max(len(h) for h in heads)
            idx.append(np.stack([np.pad(np.asarray(h, np.int64), (0, width - len(h))) for h in heads]))
            bias.append(np.stack([np.where(np.arange(width) < len(h), 0.0, -np.inf).astype(np.float32)
                                  for h in heads]))
        out = self.gather(idx)
        out.bias = bias
        return out

    @staticmethod
    def from_arrays(k: np.ndarray, v: np.ndarray, next_position: Optional[int] = None
                    ) -> "KVCache":
        """From ``[L, H_kv, N, d]`` arrays such as a fixture's k.npy / v.npy (all layers)."""
        n = k.shape[2] if next_position is None else next_position
        return KVCache([np.asarray(x, np.float32) for x in k],
                       [np.asarray(x, np.float32) for x in v], n)
