"""Results own their memory: they outlive the inputs, and nothing leaks or is freed twice."""

import gc
import sys
import weakref

import flashcache as fc
import numpy as np
from conftest import random_kv


def test_results_outlive_their_inputs(rng):
    k, v = random_kv(rng)
    expect = fc.compress(k.copy(), v.copy(), 0.25)
    out = fc.compress(k, v, 0.25)
    del k, v
    gc.collect()
    np.testing.assert_array_equal(out.k, expect.k)
    kept = out.kept
    del out
    gc.collect()
    np.testing.assert_array_equal(kept, expect.kept)  # one array keeps its own buffer alive


def test_inputs_are_not_held_after_the_call(rng):
    k, v = random_kv(rng)
    before = sys.getrefcount(k)
    fc.compress(k, v, 0.25)
    fc.score(k, v)
    assert sys.getrefcount(k) == before


def test_result_buffers_are_freed(rng):
    k, v = random_kv(rng)
    out = fc.compress(k, v, 0.25)
    base = out.k.base  # the buffer view over the C++ vector (its capsule frees the vector with it)
    assert base is not None
    ref = weakref.ref(base)
    del out, base
    gc.collect()
    assert ref() is None


def test_many_calls_do_not_grow_memory(rng):
    import resource

    k, v = random_kv(rng, tokens=512, dim=64)
    for _ in range(20):
        fc.compress(k, v, 0.2)
    start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(300):
        fc.compress(k, v, 0.2)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start < 20_000  # KiB
