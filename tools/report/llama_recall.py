"""Markdown sections for a fact asked after a llama.cpp context was compressed: archive and recall
(bench/results/llama_recall.json, written by bench/stream/run_recall.py) and the 20-turn chat
(bench/results/llama_chat_facts.json, bench/stream/run_chat_facts.py). Every number comes from the
JSON."""
import collections


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def render(doc):
    hits = collections.defaultdict(lambda: [0, 0, []])
    for r in doc["facts"]:
        h = hits[(r["split"], r["label"])]
        h[0] += r["hit"]
        h[1] += 1
        if r.get("recall_event"):
            h[2].append(r["recall_event"])
    c = doc["choice"]
    lines = ["## A fact asked after the context was compressed", "",
             f"Command `{doc['command']}`; date {doc['date']}; {doc['machine']['cpus']} CPUs, {doc['threads']} "
             f"threads; model {doc['model']}. Split `{doc['split']}`, rule `{doc['rule']}` (written before the "
             "first row). A filler with a 6-digit code at five depths is streamed through 1,024 cells in chunks "
             f"of {doc['chunk']}; then the question arrives as a new turn (`flashcache_chat --ask`) and 12 tokens "
             "are generated; a fact is found when the code is in them. The full cache holds 4,096 cells. With "
             "the archive, each compaction's evicted cells are kept (positions kept) and the question's own "
             "queries bring back up to the recall budget, after which the question is decoded again.", "",
             "Dev, the candidates (the choice in bold):", "",
             "| row | dev facts found |", "|---|---|"]
    for cand in c["candidates"]:
        name = f"**{cand['label']}**" if cand["label"] == c["chosen"] else cand["label"]
        lines.append(f"| {name} | {cand['dev_hits']} of 5 |")
    dg = doc.get("digest_choice")
    if dg:
        lines.append(f"| {dg['label']} (stage 4b) | {dg['dev_hits']} of 5 |")
    lines += ["", f"Recall on by default in `flashcache_chat`'s flashcache mode: **{'yes' if c['on_by_default'] else 'no'}** "
              "(stage 4, step 4)." + (
                  f" Stage 4b, the digest: median score time {dg['dev_median_score_ms']:.0f} ms against "
                  f"{dg['dev_median_score_ms_exact']:.0f} ms exact; it {'wins' if dg['wins'] else 'does not win'}."
                  if dg else ""), "",
              "Every row on both splits (held-out run once, after the choice):", "",
              "| split | row | facts found | median recall: score ms | write ms | decode again ms | the question's "
              "own decode ms | cells back |",
              "|---|---|---|---|---|---|---|---|"]
    for (split, lab), (hit, n, ev) in sorted(hits.items(), key=lambda kv: (kv[0][0] != "dev", kv[0][1])):
        if ev:
            cost = (f"{_median(e['score_ms'] for e in ev):.0f} | {_median(e['write_ms'] for e in ev):.0f} | "
                    f"{_median(e['redo_ms'] for e in ev):.0f} | {_median(e['turn_decode_ms'] for e in ev):.0f} | "
                    f"{_median(e['recalled'] for e in ev)}")
        else:
            cost = "- | - | - | - | -"
        lines.append(f"| {split} | {lab} | {hit} of {n} | {cost} |")
    ev = [r["recall_event"] for r in doc["facts"] if r.get("recall_event") and r["label"] == c["chosen"]]
    if ev:
        lines += ["", f"The archive held {_median(e['archive_tokens'] for e in ev):,} cells "
                  f"({_median(e['archive_bytes'] for e in ev) / 2**20:.1f} MiB; the 1,024 resident cells hold about "
                  f"{1024 * _median(e['archive_bytes'] / e['archive_tokens'] for e in ev) / 2**20:.1f} MiB) when the "
                  "question came, with the chosen setting (medians)."]
    lines += ["", "Running text with the archive (nothing is asked in a stream, so this measures keeping positions "
              "instead of renumbering), against the when-full default's NLL recorded by the stream study:", "",
              "| split | cells | NLL with the archive | the default's | avg cells |", "|---|---|---|---|---|"]
    for r in doc["streams"]:
        ref = (c["dev_default_nll"] if r["split"] == "dev" else doc["heldout_default_nll"]).get(str(r["cells"]))
        lines.append(f"| {r['split']} | {r['cells']:,} | {r['stream_nll']:.4f} | "
                     f"{ref:.4f} | {r['avg_cells']:.0f} |" if ref is not None else "")
    lines.append("")
    return "\n".join(lines)


def render_chat(doc):
    lines = ["## A 20-turn chat: facts of turns 1-5 asked in turns 16-20", "",
             f"Command `{doc['command']}`; date {doc['date']}; {doc['threads']} threads. Split `{doc['split']}`: "
             "five facts in turns 1-5, ten passages to summarize in turns 6-15, the facts asked in turns 16-20, "
             "greedy replies of at most 32 tokens, through 1,024 cells (the full cache: 8,192). No policy "
             "setting was chosen on it; the passage length was, by a precondition written before those rows (the "
             f"full cache must answer 4 of 5 dev facts; tried 150, 100, 75 words): "
             f"{doc['passage_words'] if doc['passage_words'] else 'none passed'}. The split file records two "
             "earlier dev-only revisions of the script. The recall row keeps the archive in eviction order "
             "(stage 4); in position order, the default since stage 5, see the next section. Measured with "
             "each reply's end-of-turn tokens never decoded (`flashcache_chat --turn-end open`, the only stream "
             "then; llama.cpp's simple-chat example does the same): with them decoded, as the template writes "
             "them and a server reads them, the full cache answers 0 of 5 at 150, 100 and 75 words (2026-12-06, "
             "dev; \"Through the server\" below), so these facts measure recall in that stream only.", "",
             "| split | passage words | policy | facts found | avg cells | compactions | recall ms (all turns) | "
             "the turns' own decode ms | cells back | archive MiB (most) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        rec = r["recalls"]
        lines.append(f"| {r['split']} | {r['passage_words']} | {r['policy']} | {r['found']} of {r['of']} | {r['avg_cells']:.0f} | "
                     f"{r['events']} | " + (f"{r['recall_ms']:.0f} | {r['turn_decode_ms']:.0f} | {r['recalled']} | "
                                            f"{r['archive_bytes_max'] / 2**20:.1f} |" if rec else "- | - | - | - |"))
    lines.append("")
    return "\n".join(lines)


def render_order(doc):
    e, p = doc["eviction"], doc["position"]
    show = lambda x: "not run (position order did not win on dev)" if x is None else f"{x} of 5"  # noqa: E731
    lines = ["## Archive blocks by position (stage 5)", "",
             f"Command `{doc['command']}`; date {doc['date']}; {doc['threads']} threads; rule `{doc['rule']}`, "
             "written after the 20-turn chat's rows, held-out included, had been seen. Stage 4's recall setting "
             "(64 cells, blocks of 32, the turn decoded again) with the archive kept in eviction order (stage 4's "
             "rows) or in position order.", "",
             "| archive order | dev facts asked later | dev chat | held-out facts | held-out chat |",
             "|---|---|---|---|---|",
             f"| eviction | {e['dev_facts']} of 5 | {e['dev_chat']} of 5 | {e['heldout_facts']} of 5 | "
             f"{e['heldout_chat']} of 5 |",
             f"| position | {p['dev_facts']} of 5 | {p['dev_chat']} of 5 | {show(p['heldout_facts'])} | "
             f"{show(p['heldout_chat'])} |", "",
             f"Position order {'wins on dev and is the default' if doc['wins'] else 'does not win on dev'}.", ""]
    return "\n".join(lines)
