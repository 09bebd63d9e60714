"""flashcache as kvpress presses (NVIDIA's kvpress, 0.5.5): the library beside the field's methods.

``FlashCachePress(compression_ratio)`` is a ScorerPress: inside kvpress's prefill hook each layer
is scored by the C++ scorer and every KV head keeps what the library's selection keeps (the
defaults as a user gets them: the first 4 tokens, a recent window of half the budget, the rest
by outlier score), at kvpress's own count ``max(1, int(N * (1 - ratio)))``. Its ``score`` returns
[batch, kv_heads, tokens] with the library's kept set on top, so kvpress's top-k keeps exactly it.

``FlashCacheModelPress(compression_ratio)`` keeps the library's dynamic per-layer budgets: a
cross-layer budget needs the whole prefill, so, as kvpress's KVzip does, it acts after the
prefill over every global layer at once. By default it masks the evicted keys through kvpress's
attention patch, as KVzip and AdaKV do (comparable rows; memory is not freed); with
``compact=True`` it really shrinks each layer instead (flashcache.hf: the model is switched to
the ragged attention, and the next tokens need explicit positions, as kvpress's pipeline gives).

Recall of evicted tokens, the question asked after compression: ``flashcache.kvpress_recall``.

Needs torch and kvpress (``pip install flashcache[kvpress]``).
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MethodType
from typing import Any

import torch
from kvpress import BasePress, ScorerPress
from kvpress.utils import compute_n_kept

from . import hf
from ._core import TAIL_LAST_QUERIES, QueryInput
from .compress import compress
from .options import Options, QueryTailOptions, _enum
from .tails import query_tails


@contextmanager
def prefill_cache(model: Any) -> Generator[dict, None, None]:
    """While open, notes the cache the model's prefill fills (``captured["cache"]``), for a press
    that acts after the whole prefill."""
    base = model.model
    captured: dict[str, Any] = {}
    original = base.forward

    def capturing_forward(model_self: Any, *args: Any, **kwargs: Any) -> Any:
        captured["cache"] = kwargs.get("past_key_values")
        return original(*args, **kwargs)

    base.forward = MethodType(capturing_forward, base)
    try:
        yield captured
    finally:
        base.forward = original


def _ranked(scores: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Scores [heads, tokens] with the kept tokens above every other: kept ones in [1, 2), the rest in [0, 1)."""
    s = torch.nan_to_num(scores.float(), nan=0.0, posinf=0.0)
    s = s / (s.amax(dim=-1, keepdim=True).clamp_min(1e-30) * 1.0001)  # [0, 1) per head
    kept = kept.to(torch.int64)
    return s.scatter(-1, kept, s.gather(-1, kept) + 1.0)


@dataclass
class FlashCachePress(ScorerPress):
    """FlashCache per layer: every KV head keeps the library's choice of ``1 - compression_ratio`` of the tokens.

    With ``Options.with_query_tail()`` (``options.score.query`` is ``tail``) the prompt's queries
    inform the score: the press recomputes the layer's queries from its input, raises the keys'
    tails from the last ones (``query_tails``, the library's chosen feed) and mixes them in. That is
    the query-aware protocol's row, where the question is part of what is compressed. A sliding-window
    layer (Gemma 2 and 3) is left alone in a cache made with the model's config (kvpress's own pipeline
    makes one without it: pass ``cache=DynamicCache(config=model.config)``, or use RecallPipeline).
    """

    compression_ratio: float = 0.0
    options: Options = field(default_factory=Options)
    # With tails: how many of the prompt's last queries feed them (the library's chosen feed: 256).
    tail_queries: int = TAIL_LAST_QUERIES

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tail_queries < 1:
            raise ValueError(f"FlashCachePress: tail_queries {self.tail_queries} must be at least 1")

    def compress(
        self, module: Any, hidden_states: Any, keys: torch.Tensor, values: torch.Tensor, attentions: Any, kwargs: dict
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # kvpress hooks a sliding-window layer (Gemma 2 and 3) unless the model is
        # Gemma3ForConditionalGeneration. Such a layer keeps its own window and is left alone, as
        # kvpress leaves Gemma 3's: the decoder's masks then follow each kind of layer's length when the
        # cache knows the layer kinds (DynamicCache(config=model.config)); one that does not is refused.
        if getattr(module, "is_sliding", False):
            cache = kwargs.get("past_key_values")
            kinds = getattr(cache, "is_sliding", None)
            if kinds is not None and kinds[module.layer_idx]:
                return keys, values
            raise ValueError(
                f"FlashCachePress: layer {getattr(module, 'layer_idx', '?')} is a sliding-window layer and the "
                "cache does not know it (the attention masks would miss the compressed global layers): pass "
                "cache=DynamicCache(config=model.config) to the pipeline, as RecallPipeline does"
            )
        return super().compress(module, hidden_states, keys, values, attentions, kwargs)

    @torch.no_grad()
    def score(
        self,
        module: Any,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: Any,
        kwargs: dict,
    ) -> torch.Tensor:
        batch, _, tokens, _ = keys.shape
        n_kept = compute_n_kept(tokens, self.compression_ratio)
        with_tails = _enum(QueryInput, self.options.score.query, "ScoreOptions.query") is QueryInput.tail
        queries = hf.attention_queries(module, hidden_states, kwargs["position_embeddings"]) if with_tails else None
        feed = QueryTailOptions.last_queries(tokens, self.tail_queries) if with_tails else None
        out = torch.empty(keys.shape[:3], dtype=torch.float32)
        for b in range(batch):
            k, v = keys[b].cpu(), values[b].cpu()
            tails = query_tails(queries[b].float().cpu(), k.float(), feed) if with_tails else None
            layer = compress(k, v, n_kept, self.options, tails=tails)
            out[b] = _ranked(torch.as_tensor(layer.scores), torch.as_tensor(layer.kept))
        return out.to(keys.device)


@dataclass
class AfterPrefillPress(BasePress):
    """A press that acts once the whole prefill is in the cache (a cross-layer budget, an archive):
    nothing per layer; ``after_prefill(model, cache)`` runs when the prefill's context closes."""

    compression_ratio: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.compression_ratio < 1.0:
            raise ValueError(f"compression_ratio {self.compression_ratio} is outside [0, 1)")

    def compress(
        self, module: Any, hidden_states: Any, keys: torch.Tensor, values: torch.Tensor, attentions: Any, kwargs: dict
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return keys, values  # nothing per layer: the whole prefill is needed first

    @contextmanager
    def __call__(self, model: Any) -> Generator:
        with prefill_cache(model) as captured:
            yield
        self.after_prefill(model, captured.get("cache"))

    def after_prefill(self, model: Any, cache: Any) -> None:
        raise NotImplementedError


@dataclass
class FlashCacheModelPress(AfterPrefillPress):
    """FlashCache over the whole model after prefill: per-layer budgets by each layer's energy ratio.

    The total kept is ``1 - compression_ratio`` of every global layer's tokens (kvpress's
    leaderboard counts the same way); sliding-window layers (Gemma 3) are left alone.
    """

    options: Options = field(default_factory=Options)
    compact: bool = False
    last: hf.CacheCompression | None = field(default=None, init=False, repr=False)

    def after_prefill(self, model: Any, cache: Any) -> None:
        if self.compression_ratio == 0 or cache is None:
            return
        if self.compact:
            self.last = hf.compress_cache(cache, 1.0 - self.compression_ratio, self.options, model=model)
            hf.ragged_attention(model)
        else:
            self._mask(model, cache)

    @torch.no_grad()
    def _mask(self, model: Any, cache: Any) -> None:
        """kvpress's way: every layer's evicted (batch, head, token) go to its masked_key_indices."""
        chosen, kept = hf.kept_sets(
            cache, 1.0 - self.compression_ratio, self.options, model=model, who="FlashCacheModelPress"
        )
        modules = attention_modules(model)
        for i, per_seq in zip(chosen, kept):
            keys = cache.layers[i].keys
            drop = torch.ones(keys.shape[:3], dtype=torch.bool)  # [batch, heads, tokens]
            for b, index in enumerate(per_seq):
                drop[b].scatter_(1, index, False)
            b, h, t = drop.nonzero(as_tuple=True)
            modules[i].masked_key_indices = (b.to(keys.device), h.to(keys.device), t.to(keys.device))


def attention_modules(model: Any) -> list[Any]:
    """Every decoder layer's attention module (a multimodal model's language model's)."""
    base = getattr(model.model, "language_model", model.model)
    return [layer.self_attn for layer in base.layers]
