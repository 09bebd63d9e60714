"""Markdown section for long texts and early facts through a bounded llama.cpp context
(bench/results/llama_stream.json, written by bench/stream/run_stream.py): streamed NLL per
policy at 1,024 and 2,048 cells with the average cells each kept, early-fact recall, the
when-full default's choice on dev, and each compression's time against the decode time
since the previous one; the query-tail rows of RULE.md's stage 3 beside them. Every number
comes from the JSON."""


def _by_split(rows, split):
    return [r for r in rows if r["split"] == split]


def _stream_table(rows):
    labels = []
    for r in rows:
        if r["label"] not in labels:
            labels.append(r["label"])
    full = {r["cells"]: r["stream_nll"] for r in rows if r["policy"] == "full"}
    out = ["| policy | NLL, 1,024 cells | / full | avg cells | events | NLL, 2,048 cells | / full | avg cells | events |",
           "|---|---|---|---|---|---|---|---|---|"]
    for lab in labels:
        cols = [lab]
        for cells in (1024, 2048):
            r = next((x for x in rows if x["label"] == lab and x["cells"] == cells), None)
            if r is None:
                cols += ["-"] * 4
                continue
            ratio = r["stream_nll"] / full[cells] if full.get(cells) else float("nan")
            cols += [f"{r['stream_nll']:.4f}", f"{ratio:.3f}", f"{r['avg_cells']:.0f}", str(r["events"])]
        out.append("| " + " | ".join(cols) + " |")
    return out


def _fact_table(rows):
    labels = []
    for r in rows:
        if r["label"] not in labels:
            labels.append(r["label"])
    depths = sorted({r["depth"] for r in rows})
    out = ["| policy | " + " | ".join(f"depth {d:g}" for d in depths) + " | found |",
           "|---|" + "---|" * len(depths) + "---|"]
    for lab in labels:
        hits = [next((x["hit"] for x in rows if x["label"] == lab and x["depth"] == d), None) for d in depths]
        found = sum(1 for h in hits if h)
        out.append(f"| {lab} | " + " | ".join("-" if h is None else ("yes" if h else "no") for h in hits) +
                   f" | {found}/{len(depths)} |")
    return out


def _timing(rows):
    out = ["| split | cells | policy | events | median ms / event | median share of the decode time since the "
           "previous event | largest share | tokens/s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["policy"] == "full":
            continue
        out.append(f"| {r['split']} | {r['cells']} | {r['label']} | {r['events']} | {r['event_ms_median']:.1f} | "
                   f"{100 * r['event_share_median']:.2f}% | {100 * r['event_share_max']:.2f}% | "
                   f"{r['tokens_per_s']:.1f} |")
    return out


def render(doc):
    m = doc.get("machine", {})
    choice = doc["choice"]
    lines = ["## Long texts through a bounded llama.cpp context", "",
             f"Command `{doc['command']}`; date {doc['date']}; {m.get('cpus')} CPUs, load average "
             f"{m.get('loadavg_before', '?').split(' ')[0]} before and {m.get('loadavg_after', '?').split(' ')[0]} "
             f"after; model {doc['model']}, {doc['threads']} threads, chunks of {doc['chunk']} tokens. Split: "
             f"`{doc['split']}`; rule: `{doc['rule']}`. Each row is one `flashcache_chat -f` run: the text is "
             "teacher-forced through the bounded context and the NLL counts the tokens from the cap on (the full "
             "cache's row counts the same tokens). shift is llama.cpp's context shift (keep 4, discard half), "
             "streaming is StreamingLLM (sink 4, evicting what the next chunk needs; \"3/4 of the cells\": its "
             "cap cut to give about shift's average cells), flashcache compacts to the target share of the "
             "cells when full, the window share of the kept cells being the newest (positions renumbered "
             "unless kept; \"paper\": `Options::paper()`'s score; \"query tail\": `--query-tail`). Average cells: the cells in the cache per "
             "decoded token.", ""]
    for stage, note in doc.get("stages", {}).items():
        lines.append(f"Stage {stage}: {note}.")
    if doc.get("stages"):
        lines.append("")
    lines.append("**Choice on dev** (RULE.md: at least 4 of 5 dev facts, then the lowest mean dev stream NLL "
                 "over 1,024 and 2,048 cells): " +
                 "; ".join(f"target {c['target']:g}, window {c['window_share']:g}: {c['dev_fact_hits']}/5 facts, "
                           f"NLL {c['dev_mean_stream_nll']:.4f}" for c in choice["candidates"]) +
                 f". Chosen: **{choice['chosen']['label']}**" +
                 ("" if any(c["dev_fact_hits"] >= 4 for c in choice["candidates"]) else
                  " (no candidate found 4 of the 5 dev facts, so step 3 ranked all of them: the script's "
                  "fallback)") + ".")
    tail = doc.get("tail_choice")
    if tail:
        lines.append("")
        lines.append("**Query tails on dev** (RULE.md stage 3: `--query-tail`, the queries decoded since the "
                     "previous compaction, at the chosen target; at least 4 of 5 dev facts, then the lowest mean "
                     "dev stream NLL, a tie within 0.005 to 9/10): " +
                     "; ".join(f"window {c['window_share']:g}: {c['dev_fact_hits']}/5 facts, "
                               f"NLL {c['dev_mean_stream_nll']:.4f}" for c in tail["candidates"]) +
                     f". Chosen: **{tail['chosen']['label']}**.")
    for split in ("dev", "heldout"):
        rows = _by_split(doc["streams"], split)
        if not rows:
            continue
        lines += ["", f"**Streamed NLL, {split}** ({rows[0]['text']}, {rows[0]['stream_tokens']} tokens)", ""]
        lines += _stream_table(rows)
    for split in ("dev", "heldout"):
        rows = _by_split(doc["facts"], split)
        if not rows:
            continue
        lines += ["", f"**Early facts, {split}** ({rows[0]['filler']} filler, {rows[0]['prompt_tokens']} tokens "
                  "through 1,024 cells; the full cache holds them all): is the 6-digit code in the 12 greedy "
                  "tokens after the question?", ""]
        lines += _fact_table(rows)
    lines += ["", "**Compression time** against the decode time since the previous event (prefill chunks of "
              "the stream, teacher-forced):", ""]
    lines += _timing(doc["streams"])
    lines.append("")
    return "\n".join(lines)
