"""What a caller can choose, in the library's parts: score, select, allocate.

Each dataclass mirrors the C++ struct of the same name (include/flashcache/options.hpp)
field for field, and reads its defaults from it, so the two cannot drift apart. An
enumeration field takes the enum (``flashcache.Base.peak``) or its name (``"peak"``).
Where each default comes from: docs/DEFAULTS.md. Values are checked by the call that
uses them, which raises ``flashcache.Error`` (a ValueError) naming the problem.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from . import _core
from ._core import (
    Allocation,
    ArchiveOrder,
    Base,
    GridZone,
    HeadCombine,
    KeepSet,
    MeanDistance,
    QueryInput,
    RopeLayout,
    TailMix,
    Transform,
)

_DEFAULT = _core.Options()
_SHARED = _core.SharedKeepOptions()
_TAIL = _core.QueryTailOptions()
_ARCHIVE = _core.ArchiveOptions()


def _enum(cls: type[enum.Enum], value: Any, name: str) -> enum.Enum:
    """An enumeration member from itself or its name; a clear error otherwise."""
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        for member in (value, value + "_"):  # "global" is Transform.global_ (a keyword in Python)
            if member in cls.__members__:
                return cls[member]
    names = ", ".join(n.rstrip("_") for n in cls.__members__)
    raise ValueError(f"{name}: {value!r} is not one of {names}")


class _Mirror:
    """Shared by the option dataclasses: names checked at construction, conversion to C++."""

    _core_type: Any = None
    _enums: dict[str, type[enum.Enum]] = {}

    def __post_init__(self) -> None:
        for name, cls in self._enums.items():
            setattr(self, name, _enum(cls, getattr(self, name), f"{type(self).__name__}.{name}"))

    def _to_core(self) -> Any:
        out = self._core_type()
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name in self._enums:  # a name assigned after construction (options.score.base = "peak")
                value = _enum(self._enums[f.name], value, f"{type(self).__name__}.{f.name}")
            setattr(out, f.name, value._to_core() if isinstance(value, _Mirror) else value)
        return out


@dataclass
class RopeOptions(_Mirror):
    """Score keys in their pre-RoPE form: undo the rotation before the DCT (CPU only)."""

    derotate: bool = _DEFAULT.score.rope.derotate
    theta: float = _DEFAULT.score.rope.theta
    layout: RopeLayout = _DEFAULT.score.rope.layout
    first_position: int = _DEFAULT.score.rope.first_position

    _core_type = _core.RopeOptions
    _enums = {"layout": RopeLayout}


@dataclass
class ScoreOptions(_Mirror):
    """How a layer's tokens are scored: the DCT base and what is mixed into the residual."""

    gamma: float = _DEFAULT.score.gamma
    base: Base = _DEFAULT.score.base
    transform: Transform = _DEFAULT.score.transform
    block_size: int = _DEFAULT.score.block_size
    normalize_terms: bool = _DEFAULT.score.normalize_terms
    rope: RopeOptions = field(default_factory=RopeOptions)
    query: QueryInput = _DEFAULT.score.query
    tail_weight: float = _DEFAULT.score.tail_weight
    tail_mix: TailMix = _DEFAULT.score.tail_mix
    mean_weight: float = _DEFAULT.score.mean_weight
    mean_mix: TailMix = _DEFAULT.score.mean_mix
    mean_distance: MeanDistance = _DEFAULT.score.mean_distance
    mean_full_keep: float = _DEFAULT.score.mean_full_keep
    mean_zero_keep: float = _DEFAULT.score.mean_zero_keep
    bridge: int = _DEFAULT.score.bridge
    grid_zone: GridZone = _DEFAULT.score.grid_zone
    grid_tile: int = _DEFAULT.score.grid_tile

    _core_type = _core.ScoreOptions
    _enums = {
        "base": Base,
        "transform": Transform,
        "query": QueryInput,
        "tail_mix": TailMix,
        "mean_mix": TailMix,
        "mean_distance": MeanDistance,
        "grid_zone": GridZone,
    }


@dataclass
class SelectOptions(_Mirror):
    """Which tokens every head keeps before the scores rank the rest (they count toward the budget)."""

    sink: int = _DEFAULT.select.sink
    window: int = _DEFAULT.select.window
    window_share: float = _DEFAULT.select.window_share
    base_share: float = _DEFAULT.select.base_share
    grid_base_share: float = _DEFAULT.select.grid_base_share

    _core_type = _core.SelectOptions


@dataclass
class AllocateOptions(_Mirror):
    """How a model-wide budget is split over layers (compress_model)."""

    mode: Allocation = _DEFAULT.allocate.mode
    min_layer_ratio: float = _DEFAULT.allocate.min_layer_ratio

    _core_type = _core.AllocateOptions
    _enums = {"mode": Allocation}


@dataclass
class Options(_Mirror):
    """Everything a call reads, in the stages' order; ``Options()`` is the library's defaults."""

    score: ScoreOptions = field(default_factory=ScoreOptions)
    select: SelectOptions = field(default_factory=SelectOptions)
    allocate: AllocateOptions = field(default_factory=AllocateOptions)

    _core_type = _core.Options

    @classmethod
    def paper(cls) -> Options:
        """The paper's algorithm exactly: global low-pass DCT, gamma 0.2, no sink, no window."""
        return _from_core(_core.Options.paper(), cls)

    @classmethod
    def with_query_tail(cls, base: Options | None = None) -> Options:
        """``base`` (the defaults) with each key's tail in the score; pass ``tails=`` to the call."""
        return _from_core(_core.Options.with_query_tail((base or cls())._to_core()), cls)


@dataclass
class SharedKeepOptions(_Mirror):
    """One keep-set shared by a layer's heads (per_layer) or by the whole sequence (per_sequence).

    compress_model keeps a set per head unless it is given one of these.
    """

    keep_set: KeepSet = _SHARED.keep_set
    combine: HeadCombine = _SHARED.combine
    page: int = _SHARED.page

    _core_type = _core.SharedKeepOptions
    _enums = {"keep_set": KeepSet, "combine": HeadCombine}


@dataclass
class QueryTailOptions(_Mirror):
    """Which prompt queries feed the keys' tails (query_tails, TailAccumulator)."""

    stride: int = _TAIL.stride
    from_position: int = _TAIL.from_position
    min_distance: int = _TAIL.min_distance
    scale: float = _TAIL.scale

    _core_type = _core.QueryTailOptions

    @classmethod
    def last_queries(cls, prompt_tokens: int, count: int = _core.TAIL_LAST_QUERIES) -> QueryTailOptions:
        """The chosen feed: the prompt's last ``count`` queries."""
        return _from_core(_core.last_queries(prompt_tokens, count), cls)


@dataclass
class ArchiveOptions(_Mirror):
    """An archive's blocks (the unit a recall brings back), byte cap and order."""

    block_size: int = _ARCHIVE.block_size
    byte_cap: int = _ARCHIVE.byte_cap
    order: ArchiveOrder = _ARCHIVE.order

    _core_type = _core.ArchiveOptions
    _enums = {"order": ArchiveOrder}


def _from_core(obj: Any, cls: type) -> Any:
    """The dataclass `cls` holding the C++ struct's values."""
    values = {}
    for f in dataclasses.fields(cls):
        value = getattr(obj, f.name)
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        values[f.name] = _from_core(value, sub) if isinstance(sub, type) and issubclass(sub, _Mirror) else value
    return cls(**values)
