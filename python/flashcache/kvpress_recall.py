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

Before each question is decoded, ``RecallPipeline`` runs it to capture its queries (after
RoPE, every global layer), scores the archive's blocks with them (``RecallScorer``: the best
token's attention probability over resident, archived and question keys, one ranking for the
sequence), and appends the best whole blocks, up to the free cells, to every global layer; then
the question and the answer are decoded as kvpress does (``question_passes=2``). By default
(``question_passes=1``) the question runs once: all its tokens but the last go into the cache as
they would anyway, their queries rank the archive, the blocks come back, and the last token and the
answer are decoded over them (the question's own keys and values then never saw the recalled cells;
the answer does). The cells at
the answer are never more than kvpress's count for the ratio: the recall row is compared at equal
cells. kvpress removes the answer (and the recalled cells with it) after each question; the
archive keeps every block, so the next question recalls afresh.

Needs torch and kvpress (``pip install flashcache[kvpress]``).
"""

from __future__ import annotations

import time
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
    cells: int = 0  # a global layer's cells at the answer, the question's own left out
    seconds: float = 0.0  # what the recall added: its question pass (two passes), the scoring and the copies


@dataclass
class FlashCacheRecallPress(AfterPrefillPress):
    """FlashCache after prefill with an archive of the evicted tokens, for RecallPipeline's recall."""

    options: Options = field(default_factory=Options)
    # Of the cells kvpress's ratio allows, the share left for the recall. 0.25: chosen on bench/ruler's dev
    # samples by split.json's rule (it replaced 0.5; bench/ruler/candidates.json).
    recall_share: float = 0.25
    archive_options: ArchiveOptions = field(default_factory=ArchiveOptions)
    recall_score: str = "exact"  # RecallScorer's score: "exact" or "digest"
    # 1: the question runs once, the recall between its last token and the rest (module docstring);
    # 2: once to rank the archive, leaving no trace, then again over the recalled cells. 1: chosen on
    # bench/ruler's dev samples by the cost rule of bench/ruler/candidates_4.json (-2.7 points, within
    # one sample's worth, at 0.94 of the time); it was 2.
    question_passes: int = 1
    archive: Archive | None = field(default=None, init=False, repr=False)
    layers: list[int] = field(default_factory=list, init=False, repr=False)  # the global layers
    recall_budget: int = field(default=0, init=False)  # cells a question may bring back
    last: RecallStats = field(default_factory=RecallStats, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.recall_share < 1.0:
            raise ValueError(f"recall_share {self.recall_share} is outside [0, 1)")
        if self.question_passes not in (1, 2):
            raise ValueError(f"question_passes {self.question_passes} is neither 1 nor 2")

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
        to every global layer of ``cache``; ``position`` is the question's first position. The
        question runs once to capture its queries and leaves no trace in the cache."""
        start = time.perf_counter()
        self.last = RecallStats(cells=self._cells(cache))
        if not self._has_room():
            return self.last
        saved = [(layer.keys, layer.values, getattr(layer, "cumulative_length", None)) for layer in cache.layers]
        queries = self._question_queries(model, cache, question_ids, position)
        blocks = self._best_blocks(cache, queries, question_ids.shape[1])
        for layer, (keys, values, length) in zip(cache.layers, saved):  # the question leaves no trace
            layer.keys, layer.values = keys, values
            if length is not None:
                layer.cumulative_length = length
        return self._bring_back(cache, blocks, 0, start)

    @torch.no_grad()
    def recall_within(self, model: Any, cache: Any, question_ids: torch.Tensor, position: int) -> RecallStats:
        """The one-pass recall: ``question_ids`` (the question but its last token) run into the cache
        and stay there; their queries bring back the blocks, appended after them. ``seconds`` counts
        the scoring and the copies, not the pass, which the question needs anyway."""
        if not self._has_room():
            model.model(input_ids=question_ids, past_key_values=cache, position_ids=_positions(question_ids, position))
            self.last = RecallStats(cells=self._cells(cache) - question_ids.shape[1])
            return self.last
        queries = self._question_queries(model, cache, question_ids, position)
        start = time.perf_counter()
        blocks = self._best_blocks(cache, queries, question_ids.shape[1])
        return self._bring_back(cache, blocks, question_ids.shape[1], start)

    def _has_room(self) -> bool:
        return self.archive is not None and self.archive.tokens > 0 and self.recall_budget > 0

    def _cells(self, cache: Any) -> int:
        return int(cache.layers[self.layers[0]].keys.shape[2]) if self.layers else 0

    def _question_queries(self, model: Any, cache: Any, question_ids: torch.Tensor, position: int) -> dict:
        """Runs the question into the cache and returns every global layer's queries."""
        with hf.captured_queries(model, self.layers) as queries:
            model.model(input_ids=question_ids, past_key_values=cache, position_ids=_positions(question_ids, position))
        return queries

    def _best_blocks(self, cache: Any, queries: dict, questions: int) -> Any:
        """The archive's best blocks for the question whose keys are the cache's last ``questions``."""
        scorer = RecallScorer(self.archive, "shared", self.recall_score, threads=torch.get_num_threads())
        keys = [cache.layers[i].keys[0].float() for i in self.layers]
        scorer.add_layers(
            range(len(self.layers)),
            [queries[i][0].float().contiguous() for i in self.layers],
            [k[:, :-questions] for k in keys],
            [k[:, -questions:] for k in keys],
        )
        return select_recall(self.archive, scorer.block_scores(0), self.recall_budget)

    def _bring_back(self, cache: Any, blocks: Any, questions: int, start: float) -> RecallStats:
        """Appends the blocks to every global layer; ``questions``: the question's tokens in the cache."""
        if len(blocks) > 0:
            back, k, v = self.archive.copy_blocks(blocks)  # copies: the next question recalls afresh
            for j, i in enumerate(self.layers):
                layer = cache.layers[i]
                rows_k = torch.as_tensor(k[j]).to(layer.keys).transpose(0, 1).unsqueeze(0)
                rows_v = torch.as_tensor(v[j]).to(layer.values).transpose(0, 1).unsqueeze(0)
                layer.keys = torch.cat([layer.keys, rows_k], dim=2)
                layer.values = torch.cat([layer.values, rows_v], dim=2)
        else:
            back = []
        self.last = RecallStats(
            int(len(back)),
            int(len(blocks)),
            [int(p) for p in back],
            self._cells(cache) - questions,
            time.perf_counter() - start,
        )
        return self.last


def _positions(ids: torch.Tensor, first: int) -> torch.Tensor:
    return torch.arange(first, first + ids.shape[1], device=ids.device).unsqueeze(0)


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
        question_ids = question_ids.to(self.model.device)
        if press is not None and press.question_passes == 1 and question_ids.shape[1] > 1:
            press.recall_within(self.model, cache, question_ids[:, :-1], context_length)
            return self._greedy(question_ids[:, -1:], cache, context_length + question_ids.shape[1] - 1, max_new_tokens)
        if press is not None:
            press.recall(self.model, cache, question_ids, context_length)
        return super().generate_answer(question_ids, cache, context_length, max_new_tokens)

    def _greedy(self, ids: torch.Tensor, cache: Any, position: int, max_new_tokens: int) -> str:
        """Greedy decoding from ``ids`` (at ``position`` on), as kvpress's pipeline decodes: up to
        ``max_new_tokens`` tokens, stopping after an end-of-sequence token."""
        stop = self.model.generation_config.eos_token_id
        stop = set(stop if isinstance(stop, list) else [stop])
        answer: list[int] = []
        for step in range(max_new_tokens):
            out = self.model(input_ids=ids, past_key_values=cache, position_ids=_positions(ids, position + step))
            token = int(out.logits[0, -1].argmax())
            answer.append(token)
            if token in stop:
                break
            ids = torch.tensor([[token]], device=ids.device)
        return str(self.tokenizer.decode(answer, skip_special_tokens=True))
