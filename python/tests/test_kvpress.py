"""The kvpress presses on a tiny random Llama (skips by name without kvpress)."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the kvpress tests skip")
pytest.importorskip("kvpress", reason="kvpress is not installed: the kvpress tests skip")

import flashcache as fc  # noqa: E402
import flashcache.hf as fh  # noqa: E402
from flashcache.kvpress import FlashCacheModelPress, FlashCachePress  # noqa: E402
from flashcache.kvpress_recall import FlashCacheRecallPress  # noqa: E402
from tiny_model import prefill, tiny_gemma3, tiny_llama  # noqa: E402


def test_the_press_keeps_exactly_the_librarys_choice():
    model = tiny_llama()
    ids = torch.randint(0, 256, (1, 333))
    full = prefill(model, ids)
    press = FlashCachePress(compression_ratio=0.75)
    with press(model):
        compressed = prefill(model, ids)
    n_kept = int(333 * 0.25)
    for layer in range(4):
        k, v = full.layers[layer].keys, full.layers[layer].values
        expect = fc.compress(k[0], v[0], n_kept).kept.long()
        got = compressed.layers[layer].keys
        assert got.shape[2] == n_kept
        # The rows kept are the library's rows (kvpress orders them by score; compare as sets).
        for h in range(2):
            rows = {tuple(r.tolist()) for r in got[0, h]}
            assert rows == {tuple(r.tolist()) for r in k[0, h, expect[h]]}


def test_gemma3_sliding_layers_keep_their_window_and_the_global_ones_are_compressed():
    model = tiny_gemma3(window=64)
    ids, question = torch.randint(0, 256, (1, 300)), torch.randint(0, 256, (1, 6))
    press = FlashCachePress(compression_ratio=0.75)
    with press(model):
        cache = prefill(model, ids, with_config=True)
    full = prefill(model, ids, with_config=True)
    for i in (0, 2):  # sliding: the window, as without the press
        assert torch.equal(cache.layers[i].keys, full.layers[i].keys)
    for i in (1, 3):
        assert cache.layers[i].keys.shape[2] == int(300 * 0.25)
    # The masks follow each kind of layer: the answer decodes.
    assert fh.generate(model, cache, question, 300, 4).shape[-1] == 4


def test_a_sliding_window_layer_in_a_cache_that_does_not_know_it_is_refused_by_name():
    press = FlashCachePress(compression_ratio=0.75)
    with pytest.raises(ValueError, match="layer 0 is a sliding-window layer.*DynamicCache\\(config=model.config\\)"):
        model = tiny_gemma3()
        with press(model):
            prefill(model, torch.randint(0, 256, (1, 100)))


def test_recall_on_gemma3_brings_cells_back_to_the_global_layers_only():
    model = tiny_gemma3(window=64)
    ids, question = torch.randint(0, 256, (1, 400)), torch.randint(0, 256, (1, 6))
    press = FlashCacheRecallPress(compression_ratio=0.75)
    with press(model):
        cache = prefill(model, ids, with_config=True)
    window = [cache.layers[i].keys.clone() for i in (0, 2)]
    resident = cache.layers[1].keys.shape[2]
    assert press.layers == [1, 3]
    stats = press.recall(model, cache, question, 400)
    assert 0 < stats.recalled <= press.recall_budget
    for i in (1, 3):
        assert cache.layers[i].keys.shape[2] == resident + stats.recalled <= int(400 * 0.25)
    for j, i in enumerate((0, 2)):
        assert torch.equal(cache.layers[i].keys, window[j])
    assert fh.generate(model, cache, question, 400, 4).shape[-1] == 4


def test_the_model_press_masks_or_compacts_and_both_decode_alike():
    model = tiny_llama()
    torch.manual_seed(5)
    ids, question = torch.randint(0, 256, (1, 300)), torch.randint(0, 256, (1, 8))
    masked = FlashCacheModelPress(compression_ratio=0.8)
    with masked(model):
        cache = prefill(model, ids)
    assert cache.layers[0].keys.shape[2] == 300  # masked, as kvpress's KVzip does
    by_mask = fh.generate(model, cache, question, 300, 10)
    compact = FlashCacheModelPress(compression_ratio=0.8, compact=True)
    with compact(model):
        cache = prefill(model, ids)
    assert compact.last.bytes_after < 0.21 * compact.last.bytes_before
    by_compaction = fh.generate(model, cache, question, 300, 10)
    assert torch.equal(by_mask, by_compaction)
    with pytest.raises(ValueError, match="compression_ratio 1.0 is outside"):
        FlashCacheModelPress(compression_ratio=1.0)


def _tails_case(press):
    """A 300-token prompt's queries, its full cache and the cache `press` leaves, on the tiny Llama."""
    model = tiny_llama()
    torch.manual_seed(9)
    ids = torch.randint(0, 256, (1, 300))
    with fh.captured_queries(model, range(4)) as queries:
        full = prefill(model, ids)
    with press(model):
        compressed = prefill(model, ids)
    return queries, full, compressed


def test_the_query_tail_press_mixes_in_the_prompts_queries():
    options = fc.Options.with_query_tail()
    queries, full, compressed = _tails_case(FlashCachePress(compression_ratio=0.75, options=options))
    n_kept = int(300 * 0.25)
    differs = False
    for layer in range(4):
        k, v = full.layers[layer].keys[0], full.layers[layer].values[0]
        tails = fc.query_tails(queries[layer][0], k)
        expect = fc.compress(k, v, n_kept, options, tails=tails).kept.long()
        plain = fc.compress(k, v, n_kept).kept.long()
        differs |= not torch.equal(expect, plain)
        got = compressed.layers[layer].keys[0]
        for h in range(2):
            assert {tuple(r.tolist()) for r in got[h]} == {tuple(r.tolist()) for r in k[h, expect[h]]}
    assert differs, "the tails changed no kept set: the test would not see them missing"


def test_the_tails_feed_is_the_prompts_last_tail_queries():
    options = fc.Options.with_query_tail()
    queries, full, compressed = _tails_case(FlashCachePress(compression_ratio=0.75, options=options, tail_queries=40))
    n_kept = int(300 * 0.25)
    differs = False
    for layer in range(4):
        k, v = full.layers[layer].keys[0], full.layers[layer].values[0]
        feed = fc.QueryTailOptions.last_queries(300, 40)
        expect = fc.compress(k, v, n_kept, options, tails=fc.query_tails(queries[layer][0], k, feed)).kept.long()
        default = fc.compress(k, v, n_kept, options, tails=fc.query_tails(queries[layer][0], k)).kept.long()
        differs |= not torch.equal(expect, default)
        got = compressed.layers[layer].keys[0]
        for h in range(2):
            assert {tuple(r.tolist()) for r in got[h]} == {tuple(r.tolist()) for r in k[h, expect[h]]}
    assert differs, "40 queries and 256 gave the same kept sets: the test would not see the feed ignored"
    with pytest.raises(ValueError, match="tail_queries 0 must be at least 1"):
        FlashCachePress(compression_ratio=0.5, tail_queries=0)
