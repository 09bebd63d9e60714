"""Markdown section for the compression-cost benchmark: one compression inside llama.cpp split into its steps,
against llama.cpp's prefill at the same thread count, at smooth and awkward prompt lengths
(bench/results/llama_cost.json, written by bench/run_llama_cost.sh). Every number comes from the JSON."""


def render(doc):
    m = doc["machine"]
    lines = ["## One compression inside llama.cpp against its prefill", "",
             f"Command `{doc['command']}`; date {doc['date']}; {m['cpus']} CPUs ({m['cpu']}), load average "
             f"{m['loadavg_before']} before, {m['loadavg_after']} after; llama.cpp {doc['llama_version']} "
             f"{doc['llama_commit']}. SmolLM2-135M, f16 cache, keep 0.2, the library's defaults; "
             f"{doc['notes']}.", "",
             "| tokens | threads | prefill s | compression | ms | read | score | select | write | share of prefill |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        kind = "first (cold)" if r.get("repeat", 0) == 0 else "again (warm)"
        share = r["compress_ms"] / r["prefill_ms"] if r["prefill_ms"] > 0 else float("nan")
        lines.append(f"| {r['prompt_tokens']:,} | {r['threads']} | {r['prefill_ms'] / 1000:.1f} | {kind} | "
                     f"{r['compress_ms']:.0f} | {r['read_ms']:.0f} | {r['score_ms']:.0f} | {r['select_ms']:.1f} | "
                     f"{r['write_ms']:.0f} | {100 * share:.2f}% |")
    lines.append("")
    return "\n".join(lines)
