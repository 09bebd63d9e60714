"""Shared fixtures: random caches of awkward sizes and the C++ CLI, the independent side of the comparisons."""

import os
import shutil

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(20261204)


def random_kv(rng, heads=3, tokens=157, dim=40, dtype=np.float32):
    """A cache of uneven sizes with a few planted outlier tokens."""
    k = rng.standard_normal((heads, tokens, dim)).astype(np.float32)
    v = rng.standard_normal((heads, tokens, dim)).astype(np.float32)
    k[:, ::17] *= 6.0
    return k.astype(dtype), v.astype(dtype)


@pytest.fixture
def cli():
    """The flashcache CLI of this build (ctest passes it), else one on PATH, else the test skips by name."""
    path = os.environ.get("FLASHCACHE_CLI") or shutil.which("flashcache")
    if not path or not os.path.exists(path):
        pytest.skip("the flashcache CLI is not built (FLASHCACHE_CLI unset)")
    return path
