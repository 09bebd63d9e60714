"""flashcache: frequency-domain, outlier-aware KV cache compression (FlashCache, arXiv 2511.16786).

    import flashcache
    out = flashcache.compress(k, v, keep=0.2)          # one layer, [heads, tokens, head_dim]
    out.kept, out.k, out.v                             # kept indices, compacted K'/V'
    model = flashcache.compress_model(ks, vs, keep=0.2)  # per-layer budgets by energy ratio

numpy arrays and torch CPU tensors are read in place (no copy); CUDA tensors go to the GPU
front door when the package has it (``has_cuda``). Optional parts, imported on their own:
``flashcache.cuda`` (the GPU door), ``flashcache.kvpress`` (kvpress presses; needs torch and
kvpress) and ``flashcache.hf`` (compacting a transformers cache; needs torch). docs/PYTHON.md.
"""

from ._core import (
    Allocation,
    ArchiveOrder,
    Base,
    Error,
    GridZone,
    HeadCombine,
    KeepSet,
    MeanDistance,
    QueryInput,
    RecallScope,
    RecallScore,
    RopeLayout,
    TailMix,
    Transform,
    __version__,
)
from ._door import has_cuda
from .compress import CompressedLayer, CompressedModel, Scores, compress, compress_model, score
from .options import (
    AllocateOptions,
    ArchiveOptions,
    Options,
    QueryTailOptions,
    RopeOptions,
    ScoreOptions,
    SelectOptions,
    SharedKeepOptions,
)
from .recall import Archive, RecallScorer, select_recall
from .tails import TailAccumulator, query_tails

__all__ = [
    "AllocateOptions",
    "Allocation",
    "Archive",
    "ArchiveOptions",
    "ArchiveOrder",
    "Base",
    "CompressedLayer",
    "CompressedModel",
    "Error",
    "GridZone",
    "HeadCombine",
    "KeepSet",
    "MeanDistance",
    "Options",
    "QueryInput",
    "QueryTailOptions",
    "RecallScope",
    "RecallScore",
    "RecallScorer",
    "RopeLayout",
    "RopeOptions",
    "ScoreOptions",
    "Scores",
    "SelectOptions",
    "SharedKeepOptions",
    "TailAccumulator",
    "TailMix",
    "Transform",
    "__version__",
    "compress",
    "compress_model",
    "has_cuda",
    "query_tails",
    "score",
    "select_recall",
]
