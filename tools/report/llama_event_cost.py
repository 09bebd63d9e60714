"""Markdown section for what one compaction costs in a running llama.cpp context, query-free
and with query tails, generic and native builds (bench/results/llama_event_cost.json, written by
bench/stream/event_cost.py). Every number comes from the JSON."""


def render(doc):
    lines = ["## One compaction in a running llama.cpp context: query tails and SIMD", "",
             f"Command `{doc['command']}`; date {doc['date']}; {doc['cpus']} CPUs, {doc['threads']} threads, "
             f"load average {doc['loadavg_after']} after. The dev stream ({doc['stream']}, 8,192 tokens in chunks "
             f"of 128) through {doc['cells']:,} cells with the when-full defaults (compact to 3/4, the window "
             "9/10 of the kept cells); `--query-tail` scores with the tails of the last 256 queries decoded since "
             "the previous compaction. Native: `FLASHCACHE_NATIVE=ON` (`-march=native -mno-avx512f`). Medians over "
             "the run's compactions.", "",
             "| build | score | compactions | median ms | read | score | select | write | renumber | share of the "
             "decode time since the previous one | streamed NLL |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    step = lambda r, k: f"{r[k]:.1f}" if k in r else "-"  # runs before the split have scoring only
    for r in doc["rows"]:
        lines.append(f"| {r['build']} | {r['score']} | {r['events']} | {r['event_ms_median']:.1f} | "
                     f"{step(r, 'read_ms_median')} | {r['score_ms_median']:.1f} | {step(r, 'select_ms_median')} | "
                     f"{step(r, 'write_ms_median')} | {step(r, 'renumber_ms_median')} | "
                     f"{100 * r['event_share_median']:.2f}% | {r['stream_nll']:.4f} |")
    lines.append("")
    return "\n".join(lines)
