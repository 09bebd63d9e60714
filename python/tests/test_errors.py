"""Every bad input is refused with an exception that names the problem, never a crash."""

import flashcache as fc
import numpy as np
import pytest
from conftest import random_kv


@pytest.fixture
def kv(rng):
    return random_kv(rng, heads=2, tokens=64, dim=16)


@pytest.mark.parametrize(
    "make, error, message",
    [
        (
            lambda k, v: fc.compress(k.astype(np.float64), v.astype(np.float64)),
            TypeError,
            "k: dtype float64 is not float32",
        ),
        (lambda k, v: fc.compress(k.astype(np.int32), v), TypeError, "k: dtype int32"),
        (lambda k, v: fc.compress(k, v.astype(np.float16)), TypeError, "k is float32 but v is float16"),
        (
            lambda k, v: fc.compress(k[0], v[0]),
            ValueError,
            r"k: expected 3 dimensions \[heads, tokens, head_dim\], got shape \(64, 16\)",
        ),
        (lambda k, v: fc.compress(k[None], v[None]), ValueError, "expected 3 dimensions"),
        (lambda k, v: fc.compress(k, v[:, :50]), ValueError, "K is 2x64x16 but V is 2x50x16"),
        (lambda k, v: fc.compress(k[:, :, ::2], v[:, :, ::2]), ValueError, "the head dim must be contiguous"),
        (lambda k, v: fc.compress(k[:, ::-1], v[:, ::-1]), ValueError, "strides must be positive"),
        (lambda k, v: fc.compress(k, v, float("nan")), ValueError, "keep ratio nan is outside"),
        (lambda k, v: fc.compress(k, v, 1.5), ValueError, "keep ratio 1.5 is outside"),
        (lambda k, v: fc.compress(k, v, -3), ValueError, "keep budget -3 is negative"),
        (lambda k, v: fc.compress(k, v, 65), ValueError, "keep budget 65 > 64 tokens"),
        (lambda k, v: fc.compress(k, v, True), TypeError, "a bool is neither"),
        (lambda k, v: fc.compress(k, v, "0.2"), TypeError, "keep: expected a ratio"),
        (
            lambda k, v: fc.compress(k.tolist(), v),
            TypeError,
            "k: expected a numpy array or a torch tensor, got builtins.list",
        ),
        (lambda k, v: fc.compress(k, v, layout="thd"), ValueError, "layout 'thd' is not"),
        (lambda k, v: fc.compress(k, v, 3), ValueError, "keep budget 3 < 4 always-kept"),
        (
            lambda k, v: fc.compress(k, v, mask=np.ones(10, bool)),
            ValueError,
            "protect mask has 10 tokens but the layer has 64",
        ),
        (
            lambda k, v: fc.compress(k, v, mask=np.ones(64, np.float32)),
            TypeError,
            "mask: dtype float32, expected bool or uint8",
        ),
        (
            lambda k, v: fc.compress(k, v, 0.2, fc.Options.with_query_tail()),
            ValueError,
            "query is tail but no tails were given",
        ),
        (
            lambda k, v: fc.compress(k, v, 0.2, fc.Options.with_query_tail(), tails=np.zeros((2, 10), np.float32)),
            ValueError,
            "tails are 2x10",
        ),
        (
            lambda k, v: fc.compress(k, v, tails=np.zeros((2, 64), np.float64)),
            TypeError,
            "tails: dtype float64, expected float32",
        ),
        (lambda k, v: fc.compress_model([], []), ValueError, "no layers"),
        (lambda k, v: fc.compress_model([k, k], [v]), ValueError, "2 K layers but 1 V layers"),
        (
            lambda k, v: fc.compress_model([k, k.astype(np.float16)], [v, v.astype(np.float16)]),
            TypeError,
            "layer 1 is float16",
        ),
        (lambda k, v: fc.compress_model([k], [v], masks=[None, None]), ValueError, "2 masks for 1 layers"),
        (
            lambda k, v: fc.compress_model([k], [v], shared=fc.SharedKeepOptions(page=0)),
            ValueError,
            "page 0 must be at least 1",
        ),
        (
            lambda k, v: fc.score(k, v, fc.ScoreOptions(block_size=0, transform="blocked")),
            ValueError,
            "block_size 0 must be at least 1",
        ),
    ],
)
def test_refused_by_name(kv, make, error, message):
    k, v = kv
    with pytest.raises(error, match=message):
        make(k, v)


def test_empty_and_zero_budgets_are_results_not_errors(kv):
    k, v = kv
    out = fc.compress(k[:, :0], v[:, :0], 0.5)
    assert out.kept.shape == (2, 0)
    out = fc.compress(k, v, 0, fc.Options(select=fc.SelectOptions(sink=0)))
    assert out.kept.shape == (2, 0) and out.k.shape == (2, 0, 16)
