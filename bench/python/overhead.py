"""The Python door's cost per call: flashcache.compress from Python against the same C++ call timed in C++.

Both sides run in this process on the same arrays, one after the other, each the best of 15
rounds (the library's own time is the C++ loop in flashcache._core._time_compress); the ratio is
Python's time over C++'s. That loop is compiled inside the module, with the module's flags; so the
score of one SmolLM2 layer is also timed against the C++ benchmark program (bench_cpu's
BM_ScoreSmolLayer, built with the project's flags), which shows what the module's compiler flags
cost (nanobind's default -Os made it 4-7 times slower). Prints JSON; bench/RESULTS.md quotes it.

    PYTHONPATH=build/python python3 bench/python/overhead.py [build/bench/bench_cpu]   # or after pip install .
"""

import json
import platform
import subprocess
import sys
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


PROGRAM_TOKENS = [2048, 4099]  # BM_ScoreSmolLayer's lengths: a smooth one and a prime (Bluestein's path)


def against_program(program, rng):
    """fc.score of a SmolLM2 layer (3 KV heads, head dim 64, bfloat16) against bench_cpu's BM_ScoreSmolLayer."""
    import torch

    names = "|".join(f"BM_ScoreSmolLayer/tokens:{n}$" for n in PROGRAM_TOKENS)
    run = subprocess.run([program, f"--benchmark_filter={names}", "--benchmark_format=json",
                          "--benchmark_repetitions=5", "--benchmark_report_aggregates_only=true"],
                         check=True, capture_output=True, text=True)
    medians = {b["run_name"]: b["real_time"] / 1e3 for b in json.loads(run.stdout)["benchmarks"]
               if b.get("aggregate_name") == "median"}  # ms -> s
    rows, options = [], fc.Options().score
    for n in PROGRAM_TOKENS:
        k, v = (torch.from_numpy(rng.standard_normal((3, n, 64)).astype(np.float32)).to(torch.bfloat16)
                for _ in range(2))
        py = best(lambda: fc.score(k, v, options), ROUNDS, max(1, 8_000 // n))
        cpp = medians[f"BM_ScoreSmolLayer/tokens:{n}"]
        rows.append({"heads": 3, "tokens": n, "head_dim": 64, "dtype": "bfloat16", "python_s": py,
                     "program_s": cpp, "ratio": py / cpp})
    return rows


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
    out = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(), "rows": rows}
    if len(sys.argv) > 1:
        out["program_rows"] = against_program(sys.argv[1], rng)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
