"""Evicted tokens kept aside, and a question's queries bringing the best of them back.

An Archive holds every evicted token's position and, for every layer, its K and V rows
([kv_heads, head_dim] per token), grouped in blocks of ``block_size`` archive tokens. When a
new question arrives, its queries attend over the resident, archived and question keys; a
block scores its best token's attention probability, and ``select_recall`` takes the best
blocks, whole, within a budget (include/flashcache/archive.hpp, recall.hpp).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _arrays, _core
from ._core import RecallScope, RecallScore
from .options import ArchiveOptions, _enum

Array = Any


class Archive:
    """The evicted tokens of one sequence, in blocks; rows in one dtype (float32, float16 or bfloat16)."""

    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, dtype: str = "float16", options: ArchiveOptions | None = None
    ) -> None:
        self._a = _core.Archive(
            layers, kv_heads, head_dim, str(dtype).replace("torch.", ""), (options or ArchiveOptions())._to_core()
        )
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim

    def append(self, positions: Array, k: Sequence[Array], v: Sequence[Array]) -> None:
        """Adds n tokens: positions [n] (int32) and, per layer, K and V rows [n, kv_heads, head_dim].

        Past the byte cap the earliest whole blocks are dropped and counted (dropped_tokens).
        """
        self._a.append(
            _arrays.readable(positions, "positions"),
            [_arrays.readable(x, "k") for x in k],
            [_arrays.readable(x, "v") for x in v],
        )

    def copy_blocks(self, blocks: Array) -> tuple[np.ndarray, Array, Array]:
        """The blocks' (positions [n], K [layers, n, kv_heads, head_dim], V likewise); the archive keeps them."""
        return self._a.copy_blocks(np.ascontiguousarray(blocks, dtype=np.int64))

    def take(self, blocks: Array) -> tuple[np.ndarray, Array, Array]:
        """As copy_blocks, and the blocks leave the archive."""
        return self._a.take(np.ascontiguousarray(blocks, dtype=np.int64))

    def drop_all(self) -> None:
        self._a.drop_all()

    def block_tokens(self, block: int) -> int:
        return self._a.block_tokens(block)

    tokens = property(lambda self: self._a.tokens, doc="Archived tokens.")
    blocks = property(lambda self: self._a.blocks, doc="Blocks (the last may be short).")
    bytes = property(lambda self: self._a.bytes, doc="Bytes held: positions and rows.")
    dropped_tokens = property(lambda self: self._a.dropped_tokens, doc="Tokens dropped by the byte cap.")
    positions = property(lambda self: self._a.positions, doc="Archived positions, in archive order.")


class RecallScorer:
    """Scores an archive's blocks by a question's queries, layer by layer.

    ``scope``: ``shared`` (one ranking for the sequence) or ``per_head`` (one per layer and KV
    head, ranking ``layer * kv_heads + head``); ``score``: ``exact`` (the best token's
    attention probability) or ``digest`` (Quest's bound, which reads no archived key against a query).
    ``threads``: ``add_layers`` scores its layers on this many threads (default: every CPU of the
    machine, as ``compress_model``); the scores do not depend on it.
    """

    def __init__(
        self,
        archive: Archive,
        scope: RecallScope | str = "shared",
        score: RecallScore | str = "exact",
        threads: int | None = None,
    ):
        self._archive = archive
        self._r = _core.RecallScorer()
        self._r.reset(
            archive._a, _enum(RecallScope, scope, "scope"), _enum(RecallScore, score, "score"), _arrays.threads(threads)
        )

    def add_layer(self, layer: int, q: Array, resident: Array, question: Array, *, layout: str = "hnd") -> None:
        """The question's queries q [q_heads, m, d], the layer's resident keys [kv_heads, R, d] and the
        question's own keys [kv_heads, m, d] (positions after all others)."""
        self.add_layers([layer], [q], [resident], [question], layout=layout)

    def add_layers(
        self,
        layers: Sequence[int],
        q: Sequence[Array],
        resident: Sequence[Array],
        question: Sequence[Array],
        *,
        layout: str = "hnd",
    ) -> None:
        """Several layers at once, scored in parallel: ``layers[i]``'s arrays are ``q[i]``,
        ``resident[i]`` and ``question[i]``, as ``add_layer`` takes them (one dtype throughout)."""
        self._r.add_layers(
            [int(x) for x in layers],
            [_arrays.readable(x, "q") for x in q],
            [_arrays.readable(x, "resident") for x in resident],
            [_arrays.readable(x, "question") for x in question],
            _arrays.layout(layout),
        )

    @property
    def rankings(self) -> int:
        return self._r.rankings

    @property
    def threads(self) -> int:
        return self._r.threads

    def block_scores(self, ranking: int = 0) -> np.ndarray:
        """One ranking's score per archive block [blocks] (float32)."""
        return self._r.block_scores(self._archive.blocks, ranking)


def select_recall(archive: Archive, scores: Array, budget: int) -> np.ndarray:
    """The blocks to bring back, ascending: best first, whole blocks while they fit ``budget`` tokens,
    only blocks scoring above 0."""
    return _core.select_recall(archive._a, np.ascontiguousarray(scores, dtype=np.float32), int(budget))
