"""Markdown section for the inference-engine benchmark (bench/results/engine.json,
written by bench/engine/bench.sh): decode speed over the full and the compressed
KV cache, compression time against prefill time, KV memory before and after."""


def _best(decode, threads):
    """Highest tokens/s of the repeated runs at `threads` (the least disturbed), or None."""
    for d in decode:
        if d["threads"] == threads:
            return max(d["tokens_per_s"])
    return None


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def _settings(doc):
    """The sink and window the run set (-1: the library's defaults)."""
    set_ = [f"{k} {doc[k]}" for k in ("sink", "window") if doc.get(k, -1) >= 0]
    return ", ".join(set_) if set_ else "the library's default options"


def render(doc):
    m = doc.get("machine", {})
    threads = sorted({d["threads"] for run in doc["runs"] for c in run["configs"] for d in c["decode"]})
    lines = [
        "## Inside an engine (SmolLM2-135M, CPU)",
        "",
        f"`flashcache_engine_bench` (bench/engine): one prefill per prompt length, then the KV cache "
        f"compressed by `{doc['policy']}` ({_settings(doc)}) and "
        f"{doc['decode_steps']} greedy decode steps timed. Machine: {m.get('cpus', '?')} x {m.get('cpu', '?')}, "
        f"load average {m.get('loadavg_before', '?')} before and {m.get('loadavg_after', '?')} after (other jobs "
        f"shared the machine); date {doc.get('date', '?')}; command `{doc.get('command', '?')}`. "
        f"Decode speed is the best of {len(doc['runs'][0]['configs'][0]['decode'][0]['tokens_per_s'])} runs. "
        f"Prefill used {doc['prefill_threads']} threads. Float weights ({doc['weight_bytes'] / 1e6:.0f} MB) are "
        "read once per decoded token whatever the cache size, which limits the speed-up."
        + (f" {doc['note']}" if doc.get("note") else ""),
        "",
        "| prompt tokens | prefill s | keep | KV MB | compress ms | share of prefill | "
        + " | ".join(f"decode tok/s, {t} thr | speed-up, {t} thr" for t in threads) + " |",
        "|---|---|---|---|---|---|" + "---|---|" * len(threads),
    ]
    for run in doc["runs"]:
        full = next(c for c in run["configs"] if c["keep_ratio"] is None)
        for c in run["configs"]:
            keep = "full" if c["keep_ratio"] is None else f"{c['keep_ratio']:g}"
            kv = f"{c['kv_bytes_after'] / 1e6:.1f}"
            cms = c.get("compress_ms")
            share = None if cms is None else 100.0 * c["compress_share_of_prefill"]
            prefill = f"{run['prefill_ms'] / 1000:.1f}" if c is full else ""
            cells = [str(run["prompt_tokens"]), prefill, keep, kv, _fmt(cms, ".1f"), "-" if share is None else f"{share:.2f}%"]
            for t in threads:
                tps, base = _best(c["decode"], t), _best(full["decode"], t)
                cells += [_fmt(tps, ".2f"), "-" if tps is None or not base else f"{tps / base:.2f}x"]
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    from render_main import run
    run(render, "engine.json")
