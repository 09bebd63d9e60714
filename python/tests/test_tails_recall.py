"""Query tails in chunks and the archive's recall, against naive numpy references."""

import flashcache as fc
import numpy as np
import pytest
from conftest import random_kv


def naive_tails(q, k, min_distance, scale=None):
    """tail[h][j] = max over the group's queries i >= j + min_distance of softmax_i(j), causal, in float64."""
    hq, n, d = q.shape
    hk = k.shape[0]
    scale = scale or 1.0 / np.sqrt(d)
    out = np.zeros((hk, n))
    for g in range(hq):
        h = g // (hq // hk)
        logits = (q[g].astype(np.float64) @ k[h].astype(np.float64).T) * scale
        for i in range(n):
            p = np.exp(logits[i, : i + 1] - logits[i, : i + 1].max())
            p /= p.sum()
            js = np.arange(0, max(0, i - min_distance + 1))
            out[h, js] = np.maximum(out[h, js], p[js])
    return out


def test_tails_match_the_definition_and_chunks_agree(rng):
    k, _ = random_kv(rng, heads=2, tokens=97, dim=16)
    q = rng.standard_normal((6, 97, 16)).astype(np.float32)
    opts = fc.QueryTailOptions(min_distance=5)
    one = fc.query_tails(q, k, opts)
    np.testing.assert_allclose(one, naive_tails(q, k, 5), rtol=2e-4, atol=1e-6)
    acc, chunked = fc.TailAccumulator(), np.zeros((2, 97), np.float32)
    for first in range(0, 97, 30):
        acc.add(q[:, first : first + 30], first, k, chunked, opts)
    np.testing.assert_allclose(chunked, one, rtol=1e-5, atol=1e-7)


def test_tails_refuse_bad_input(rng):
    k, _ = random_kv(rng, heads=2, tokens=20, dim=8)
    q = rng.standard_normal((3, 20, 8)).astype(np.float32)
    with pytest.raises(fc.Error, match="3 query heads are not a multiple of 2 KV heads"):
        fc.query_tails(q, k)
    tails = np.zeros((2, 20), np.float32)
    tails.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        fc.TailAccumulator().add(k, 0, k, tails)


def test_archive_round_trip_and_recall_choice(rng):
    layers, heads, dim = 2, 2, 16
    arch = fc.Archive(layers, heads, dim, "float32", fc.ArchiveOptions(block_size=4))
    positions = np.arange(10, 30, dtype=np.int32)
    rows_k = [rng.standard_normal((20, heads, dim)).astype(np.float32) for _ in range(layers)]
    rows_v = [rng.standard_normal((20, heads, dim)).astype(np.float32) for _ in range(layers)]
    arch.append(positions, rows_k, rows_v)
    assert (arch.tokens, arch.blocks) == (20, 5)
    # A question whose queries point at archived token 13 (block 3) of layer 0, head 1.
    resident = rng.standard_normal((heads, 8, dim)).astype(np.float32) * 0.1
    question = rng.standard_normal((heads, 2, dim)).astype(np.float32) * 0.1
    q = np.zeros((heads, 2, dim), np.float32)
    q[1] = rows_k[0][13, 1] * 4
    scorer = fc.RecallScorer(arch, "per_head")
    for layer in range(layers):
        scorer.add_layer(layer, q, resident, question)
    scores = scorer.block_scores(ranking=0 * heads + 1)
    assert scores.argmax() == 3
    chosen = fc.select_recall(arch, scores, budget=4)
    np.testing.assert_array_equal(chosen, [3])
    pos, k, v = arch.take(chosen)
    np.testing.assert_array_equal(pos, positions[12:16])
    np.testing.assert_array_equal(k[0], rows_k[0][12:16])
    np.testing.assert_array_equal(v[1], rows_v[1][12:16])
    assert arch.tokens == 16


def test_recall_add_layers_in_parallel_gives_the_serial_scores(rng):
    """Layers spread over threads (5 layers on 2 and 3) score bit for bit as one thread adding them in turn."""
    layers, heads, dim = 5, 2, 16
    arch = fc.Archive(layers, heads, dim, "float32", fc.ArchiveOptions(block_size=4))
    rows = [rng.standard_normal((22, heads, dim)).astype(np.float32) for _ in range(layers)]
    arch.append(np.arange(22, dtype=np.int32), rows, rows)
    q = [rng.standard_normal((4, 3, dim)).astype(np.float32) * 2 for _ in range(layers)]
    resident = [rng.standard_normal((heads, 9, dim)).astype(np.float32) for _ in range(layers)]
    question = [rng.standard_normal((heads, 3, dim)).astype(np.float32) for _ in range(layers)]
    for scope in ("shared", "per_head"):
        serial = fc.RecallScorer(arch, scope, threads=1)
        for layer in range(layers):
            serial.add_layer(layer, q[layer], resident[layer], question[layer])
        for threads in (2, 3):
            parallel = fc.RecallScorer(arch, scope, threads=threads)
            assert parallel.threads == threads
            parallel.add_layers(range(layers), q, resident, question)
            for ranking in range(serial.rankings):
                want = serial.block_scores(ranking)
                assert want.max() > 0
                np.testing.assert_array_equal(parallel.block_scores(ranking), want)
    with pytest.raises(ValueError, match="2 layers but 1 q"):
        serial.add_layers([0, 1], q[:1], resident[:2], question[:2])
    with pytest.raises(TypeError, match="one dtype in every layer"):
        serial.add_layers([0, 1], [q[0], q[1].astype(np.float16)], resident[:2], question[:2])
    with pytest.raises(fc.Error, match="threads 0"):
        fc.RecallScorer(arch, threads=0)


def test_archive_refuses_bad_rows(rng):
    arch = fc.Archive(1, 2, 8, "float16")
    good = np.zeros((3, 2, 8), np.float16)
    with pytest.raises(TypeError, match="positions: dtype int64, expected int32"):
        arch.append(np.arange(3), [good], [good])
    with pytest.raises(TypeError, match="dtype float32 but the archive holds float16"):
        arch.append(np.arange(3, dtype=np.int32), [good.astype(np.float32)], [good])
    with pytest.raises(ValueError, match=r"expected \(3, 2, 8\)"):
        arch.append(np.arange(3, dtype=np.int32), [good[:, :1]], [good])
    with pytest.raises(ValueError, match="1 K and 2 V layers"):
        arch.append(np.arange(3, dtype=np.int32), [good], [good, good])
    with pytest.raises(TypeError, match="archive dtype 'int8'"):
        fc.Archive(1, 2, 8, "int8")
    with pytest.raises(fc.Error, match="block_size 0"):
        fc.Archive(1, 2, 8, "float16", fc.ArchiveOptions(block_size=0))


def test_recall_reads_float16_queries_as_the_float32_ones(rng):
    """f16 queries against keys gathered as floats: the same block ranking as in float32."""
    layers, heads, dim = 1, 2, 16
    rows = [rng.standard_normal((24, heads, dim)).astype(np.float16)]
    scores = {}
    for dtype in (np.float32, np.float16):
        arch = fc.Archive(layers, heads, dim, np.dtype(dtype).name, fc.ArchiveOptions(block_size=4))
        arch.append(np.arange(24, dtype=np.int32), [r.astype(dtype) for r in rows], [r.astype(dtype) for r in rows])
        q = (rows[0][[5, 17]].transpose(1, 0, 2) * 3).astype(dtype)  # [heads, 2, dim]
        resident = np.zeros((heads, 3, dim), dtype)
        scorer = fc.RecallScorer(arch, "per_head")
        scorer.add_layer(0, q, resident, q)
        scores[dtype] = scorer.block_scores(0)
    np.testing.assert_allclose(scores[np.float16], scores[np.float32], rtol=1e-5)
    assert scores[np.float16].argmax() in (1, 4)
