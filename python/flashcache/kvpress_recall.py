"""Recall of evicted tokens in kvpress's pipeline: the question asked after compression brings
back what it needs (kvpress's query-agnostic protocol, where every cheap score loses a fact
that only the question makes important).

    from flashcache.kvpress_recall import FlashCacheRecallPress, RecallPipeline

    pipe = RecallPipeline(model=model, tokenizer=tokenizer)
    press = FlashCacheRecallPress(compression_ratio=0.75)
    answer = pipe(context, question=question, press=press)["answer"]

After the prefill, ``FlashCacheRecallPress`` keeps one token set for every global layer and KV
head (a cell is a token, as in llama.cpp), chosen by the library, and moves the evicted tokens'
K and V rows to a host ``flashcache.Archive``. The cache really shrinks (every layer one length:
the stock attention works). Of kvpress's count of cells, ``max(1, int(N (1 - ratio)))``, the
share ``recall_share`` is left free at compression, for the recall.

Before each question is decoded, ``RecallPipeline`` runs it once to capture its queries (after
RoPE, every global layer), scores the archive's blocks with them (``RecallScorer``: the best
token's attention probability over resident, archived and question keys, one ranking for the
sequence), and appends the best whole blocks, up to the free cells, to every global layer; then
the question and the answer are decoded as kvpress does. The cells at the answer are never more
than kvpress's count for the ratio: the recall row is compared at equal cells. kvpress removes
the answer (and the recalled cells with it) after each question; the archive keeps every block,
so the next question recalls afresh.

Needs torch and kvpress (``pip install flashcache[kvpress]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from kvpress import BasePress, KVPressTextGenerationPipeline
from kvpress.utils import compute_n_kept
from transformers import DynamicCache

from . import hf
from .kvpress import AfterPrefillPress
from .options import ArchiveOptions, Options, SharedKeepOptions
from .recall import Archive, RecallScorer, select_recall


@dataclass
class RecallStats:
    """What the last question recalled."""

    recalled: int = 0  # cells brought back (every global layer the same tokens)
    blocks: int = 0  # archive blocks they came in
    positions: list[int] = field(default_factory=list)  # their original positions


@dataclass
class FlashCacheRecallPress(AfterPrefillPress):
    """FlashCache after prefill with an archive of the evicted tokens, for RecallPipeline's recall."""

    options: Options = field(default_factory=Options)
    # Of the cells kvpress's ratio allows, the share left for the recall. 0.25: chosen on bench/ruler's dev
    # samples by split.json's rule (it replaced 0.5; bench/ruler/candidates.json).
    recall_share: float = 0.25
    archive_options: ArchiveOptions = field(default_factory=ArchiveOptions)
    recall_score: str = "exact"  # RecallScorer's score: "exact" or "digest"
    archive: Archive | None = field(default=None, init=False, repr=False)
    layers: list[int] = field(default_factory=list, init=False, repr=False)  # the global layers
    recall_budget: int = field(default=0, init=False)  # cells a question may bring back
    last: RecallStats = field(default_factory=RecallStats, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.recall_share < 1.0:
            raise ValueError(f"recall_share {self.recall_share} is outside [0, 1)")

    def after_prefill(self, model: Any, cache: Any) -> None:
        self.archive, self.recall_budget, self.last = None, 0, RecallStats()
        if self.compression_ratio > 0 and cache is not None:
            self._compact_and_archive(model, cache)

    @torch.no_grad()
    def _compact_and_archive(self, model: Any, cache: Any) -> None:
        self.layers = hf.global_layers(model, cache)
        first = cache.layers[self.layers[0]].keys
        batch, kv_heads, tokens, head_dim = first.shape
        if batch != 1:
            raise ValueError(f"FlashCacheRecallPress: a batch of {batch} sequences; the archive holds one")
        cells = compute_n_kept(tokens, self.compression_ratio)
        self.recall_budget = int(round(cells * self.recall_share))
        resident = cells - self.recall_budget
        one_set = SharedKeepOptions(keep_set="per_sequence")
        chosen, kept = hf.kept_sets(
            cache, resident, self.options, model=model, layers=self.layers, shared=one_set, who="FlashCacheRecallPress"
        )
        index = kept[0][0][0]  # one set: every layer and head keeps these tokens, ascending
        evicted = torch.ones(tokens, dtype=torch.bool)
        evicted[index] = False
        gone = evicted.nonzero().squeeze(1)
        archive = Archive(len(chosen), kv_heads, head_dim, str(first.dtype), self.archive_options)
        rows = [
            (
                cache.layers[i].keys[0][:, gone].transpose(0, 1).contiguous(),
                cache.layers[i].values[0][:, gone].transpose(0, 1).contiguous(),
            )
            for i in chosen
        ]
        archive.append(gone.to(torch.int32), [k for k, _ in rows], [v for _, v in rows])
        for i in chosen:
            layer = cache.layers[i]
            layer.keys = layer.keys[:, :, index].contiguous()
            layer.values = layer.values[:, :, index].contiguous()
        self.archive = archive

    @torch.no_grad()
    def recall(self, model: Any, cache: Any, question_ids: torch.Tensor, position: int) -> RecallStats:
        """Brings back the archived blocks the question needs, up to ``recall_budget`` cells, appended
        to every global layer of ``cache``; ``position`` is the question's first position."""
        self.last = RecallStats()
        if self.archive is None or self.archive.tokens == 0 or self.recall_budget == 0:
            return self.last
        questions = question_ids.shape[1]
        saved = [(layer.keys, layer.values, getattr(layer, "cumulative_length", None)) for layer in cache.layers]
        positions = torch.arange(position, position + questions, device=question_ids.device).unsqueeze(0)
        with hf.captured_queries(model, self.layers) as queries:
            model.model(input_ids=question_ids, past_key_values=cache, position_ids=positions)
        scorer = RecallScorer(self.archive, "shared", self.recall_score, threads=torch.get_num_threads())
        keys = [cache.layers[i].keys[0].float() for i in self.layers]
        scorer.add_layers(
            range(len(self.layers)),
            [queries[i][0].float().contiguous() for i in self.layers],
            [k[:, :-questions] for k in keys],
            [k[:, -questions:] for k in keys],
        )
        for layer, (keys, values, length) in zip(cache.layers, saved):  # the question leaves no trace
            layer.keys, layer.values = keys, values
            if length is not None:
                layer.cumulative_length = length
        blocks = select_recall(self.archive, scorer.block_scores(0), self.recall_budget)
        if len(blocks) == 0:
            return self.last
        back, k, v = self.archive.copy_blocks(blocks)  # copies: the next question recalls afresh
        for j, i in enumerate(self.layers):
            layer = cache.layers[i]
            rows_k = torch.as_tensor(k[j]).to(layer.keys).transpose(0, 1).unsqueeze(0)
            rows_v = torch.as_tensor(v[j]).to(layer.values).transpose(0, 1).unsqueeze(0)
            layer.keys = torch.cat([layer.keys, rows_k], dim=2)
            layer.values = torch.cat([layer.values, rows_v], dim=2)
        self.last = RecallStats(int(len(back)), int(len(blocks)), [int(p) for p in back])
        return self.last


class RecallPipeline(KVPressTextGenerationPipeline):
    """kvpress's text-generation pipeline with the recall step: before each question is decoded,
    a FlashCacheRecallPress brings back the archived blocks its queries need. Its default cache knows
    the model's layer kinds, so a model with sliding-window layers (Gemma 3) decodes with its global
    layers compressed and its sliding ones keeping their window."""

    def _forward(
        self, input_tensors: dict, max_new_tokens: int = 50, press: BasePress | None = None, cache: Any = None
    ) -> Any:
        self._recall_press = press if isinstance(press, FlashCacheRecallPress) else None
        if cache is None:  # kvpress's is DynamicCache(): with the config, masks follow Gemma 3's layer kinds
            cache = DynamicCache(config=self.model.config)
        try:
            return super()._forward(input_tensors, max_new_tokens=max_new_tokens, press=press, cache=cache)
        finally:
            self._recall_press = None

    def generate_answer(self, question_ids: torch.Tensor, cache: Any, context_length: int, max_new_tokens: int) -> str:
        press = getattr(self, "_recall_press", None)
        if press is not None:
            press.recall(self.model, cache, question_ids.to(self.model.device), context_length)
        return super().generate_answer(question_ids, cache, context_length, max_new_tokens)
