"""RESULTS.md's Python sections: the door's cost per call (bench/python/overhead.py) and the memory a
compacted transformers cache releases (bench/python/cache_memory.py), from their JSON."""

from __future__ import annotations


def _shape_table(columns: list[str], rows: list[dict], cells) -> list[str]:
    """A markdown table with one row per layer shape (heads x tokens x head_dim), then ``cells(row)``."""
    lines = ["| heads x tokens x head_dim | " + " | ".join(columns) + " |", "| --- |" + " ---: |" * len(columns)]
    for r in rows:
        lines.append(f"| {r['heads']} x {r['tokens']} x {r['head_dim']} | " + " | ".join(cells(r)) + " |")
    return lines


def render_overhead(data: dict) -> str:
    lines = ["## The Python door's cost per call (CPU)", "",
             "`flashcache.compress(k, v, 0.2)` from Python against `flashcache::compress` timed in C++ in the same",
             "process, on the same float16 arrays (one layer, `hnd`), best of 15 rounds each; "
             f"{data.get('date', '2026-12-04')}, this",
             f"project's 2-core {data['machine']} machine, Python {data['python']}. Command: "
             f"`{data.get('command', 'PYTHONPATH=build/python python3 bench/python/overhead.py')}`",
             "(JSON: `bench/results/python_overhead.json`).", ""]
    lines += _shape_table(["Python (ms)", "C++ (ms)", "ratio", "Python's extra (us)"], data["rows"], lambda r: [
        f"{r['python_s'] * 1e3:.3f}", f"{r['cpp_s'] * 1e3:.3f}", f"{r['ratio']:.3f}", f"{r['overhead_us']:.0f}"])
    lines += ["", "The door's own work is a few tens of microseconds a call (the checks, the options' conversion,",
              "handing the result buffers to numpy without a copy); on a real layer it is inside the run-to-run",
              "noise of about 1% (a negative difference is noise). The CLI path it replaces started a process and",
              "wrote and read `.npy` files on every call.", ""]
    if data.get("program_rows"):
        lines += ["The C++ loop above is compiled inside the module, with the module's flags. Against the C++",
                  "benchmark program, built with the project's flags (`bench_cpu`'s `BM_ScoreSmolLayer`, median of",
                  "5), `flashcache.score` of one SmolLM2-135M layer (bfloat16):", ""]
        lines += _shape_table(["Python (ms)", "C++ program (ms)", "ratio"], data["program_rows"], lambda r: [
            f"{r['python_s'] * 1e3:.2f}", f"{r['program_s'] * 1e3:.2f}", f"{r['ratio']:.2f}"])
        lines += ["", "Until 2026-12-06 the module was built with nanobind's default `-Os`: its library code ran 4-7",
                  "times slower than the program's (16.7 ms against 3.6 ms for this layer at 2,048 tokens; the 8 x",
                  "1,024 x 128 row above took 65 ms), which the in-module comparison could not show. It is built",
                  "`NOMINSIZE` now (python/CMakeLists.txt).", ""]
    return "\n".join(lines)


def render_cache_memory(data: dict) -> str:
    mib = 1024 * 1024
    freed = "are freed (a weak reference to them is dead after the call)" if data["old_tensors_freed"] else \
        "are NOT freed"
    lines = ["## A transformers cache compacted by flashcache.hf (CPU)", "",
             f"`flashcache.hf.compress_cache(cache, {data['keep']}, model=model)` on {data['model']}, after a prefill of",
             f"{data['tokens']} tokens of Python's own `os.py` ({data['layers']} layers); 2026-12-04, this",
             "project's 2-core machine. Command: `PYTHONPATH=build/python python3 bench/python/cache_memory.py "
             f"{data['tokens']}`", "(JSON: `bench/results/python_cache_memory.json`).", "",
             "| | before | after |", "| --- | ---: | ---: |",
             f"| the cache's K and V | {data['cache_bytes_before'] / mib:.1f} MiB | {data['cache_bytes_after'] / mib:.1f} MiB |",
             f"| the process's resident memory | {data['rss_mib_before']:.0f} MiB | {data['rss_mib_after']:.0f} MiB |",
             "", f"The full tensors {freed}: {data['released_share']:.0%} of the cache's",
             "bytes. The process's resident memory does not show it: the allocator keeps the freed pages",
             "for the next tensors (the next decode steps reuse them); a masked cache (kvpress's AdaKV and KVzip)",
             "frees nothing at all.", ""]
    return "\n".join(lines)
