"""The Python door's cost per call: flashcache.compress from Python against the same C++ call timed in C++.

Both sides run in this process on the same arrays, one after the other, each the best of 15
rounds (the library's own time is the C++ loop in flashcache._core._time_compress); the ratio is
Python's time over C++'s. Prints JSON; bench/RESULTS.md quotes it.

    PYTHONPATH=build/python python3 bench/python/overhead.py   # or after pip install .
"""

import json
import platform
import time

import flashcache as fc
import numpy as np
from flashcache import _arrays, _core

ROUNDS = 15  # best of: the other core's load moves single rounds by tens of microseconds

SHAPES = [  # (heads, tokens, head_dim): a tiny call where the door dominates, then real layers
    (1, 128, 64),
    (8, 1024, 128),
    (8, 4096, 128),
]


def best(fn, rounds, repeats):
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        out.append((time.perf_counter() - start) / repeats)
    return min(out)


def main():
    rng = np.random.default_rng(0)
    rows = []
    for heads, tokens, dim in SHAPES:
        k = rng.standard_normal((heads, tokens, dim)).astype(np.float16)
        v = rng.standard_normal((heads, tokens, dim)).astype(np.float16)
        repeats = max(1, 20_000 // tokens)
        options = fc.Options()
        py = best(lambda: fc.compress(k, v, 0.2, options), ROUNDS, repeats)
        core = options._to_core()
        budget = _arrays.budget(0.2)
        cpp = min(_core._time_compress(k, v, _core.Layout.hnd, budget, core, repeats) for _ in range(ROUNDS))
        rows.append({"heads": heads, "tokens": tokens, "head_dim": dim, "dtype": "float16",
                     "python_s": py, "cpp_s": cpp, "ratio": py / cpp, "overhead_us": (py - cpp) * 1e6})
    print(json.dumps({"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
                      "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
