"""RESULTS.md's "Through the server" section, from bench/results/server_facts.json (written by
bench/stream/run_server_facts.py): the 20-turn facts chat through flashcache.server beside the C++
chat program, in the same run."""


CHAT_DEFAULT = "flashcache + archive and recall (defaults)"
SERVER_DEFAULT = "server: flashcache + archive and recall (defaults)"


def _mean(values):
    return sum(values) / len(values) if values else 0.0


def render(doc):
    rows = doc["rows"]
    out = ["## Through the server: the 20-turn facts chat with an OpenAI client", "",
           "The chat of `bench/stream/chat_split.json`: facts given in turns 1-5, passages of "
           f"{doc['passage_words']} words in turns 6-15, the facts asked in turns 16-20, greedy replies of at most "
           "32 tokens, through `python -m flashcache.server` with the `openai` client (each turn streamed, "
           "the whole conversation resent) and, in the same run, through the C++ chat program "
           f"(`flashcache_chat --turn-end close`) on the same turns: both decode each reply's end-of-turn tokens "
           f"with the next turn, as the model's template writes them. {doc['threads']} llama.cpp thread(s); {doc['machine']}; "
           f"{doc['date']}; command `{doc['command']}`. Nothing was chosen on these runs.", ""]
    out += ["| split | row | cells | facts found | replies as the C++ program's | wall s | s per turn | "
            "first token, turns 1-5 (s) | first token, turns 16-20 (s) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        per_turn = r["wall_s"] / 20
        early = f"{_mean(r['ttft_s'][:5]):.2f}" if r.get("ttft_s") else ""
        late = f"{_mean(r['ttft_s'][15:]):.2f}" if r.get("ttft_s") else ""
        same = f"{r['same_replies_as_cpp']} of 20" if "same_replies_as_cpp" in r else ""
        out.append(f"| {r['split']} | {r['row']} | {r['cells']} | {r['found']} of {r['of']} | {same} | {r['wall_s']:.1f} | "
                   f"{per_turn:.2f} | {early} | {late} |")
    out.append("")
    for split in sorted({r["split"] for r in rows}):
        cpp = [r for r in rows if r["split"] == split and r["row"].startswith("C++ chat") and "defaults" in r["row"]]
        srv = [r for r in rows if r["split"] == split and "defaults" in r["row"] and r["row"].startswith("server")]
        if cpp and srv:
            out.append(f"- {split}: the server's wall time is {srv[0]['wall_s'] / cpp[0]['wall_s']:.2f} times the "
                       "C++ chat program's for the same 20 turns and policy (the Python layer, the chat template, "
                       "HTTP and the resent conversation's prefix match, beside a process per run).")
    for split in sorted({r["split"] for r in rows}):
        pair = [r for r in rows if r["split"] == split and r["row"] in ("C++ chat: full", "server: full cache")]
        if len(pair) == 2 and "replies" in pair[0] and "replies" in pair[1]:
            differ = [i for i, (a, b) in enumerate(zip(pair[0]["replies"], pair[1]["replies"])) if a != b]
            out.append(f"- {split}, full cache: " + (f"the first reply that differs is turn {differ[0] + 1} (not isolated "
                       "further: the server re-reads each reply as text, whose tokens can differ from the generated "
                       "ones, and decodes in other batches)" if differ else "every reply is the C++ program's") + ".")
    for split in sorted({r["split"] for r in rows}):
        found = {r["row"]: r["found"] for r in rows if r["split"] == split and r.get("stream") == "open"}
        cpp, srv = found.get(f"C++ chat (open turns): {CHAT_DEFAULT}"), found.get(f"{SERVER_DEFAULT} (open turns)")
        if cpp is not None and srv is not None:
            out.append(f"- {split}, open turns (the chat so far as one raw prompt through `/v1/completions`, each "
                       f"reply's end-of-turn tokens never decoded): the server's defaults find {srv} of 5, the C++ "
                       f"program's {cpp} of 5; without recall {found.get('server: flashcache, no recall (open turns)')} "
                       f"and {found.get('C++ chat (open turns): flashcache, no recall')}; the full cache "
                       f"{found.get('server: full cache (open turns)')} and {found.get('C++ chat (open turns): full')}.")
    full = [r for r in rows if r["row"] in ("C++ chat: full", "server: full cache")]
    if full and all(r["found"] <= 1 for r in full):
        out.append("- With the full cache neither path finds the facts: with each reply closed by its end-of-turn "
                   "tokens, SmolLM2-135M does not answer this chat (its precondition, 4 of 5 dev facts with the "
                   "full cache, fails), so the facts compare nothing here; the replies column says whether the "
                   "server decodes what the C++ program decodes. The 20-turn chat's sections above were measured "
                   "with `--turn-end open` (llama.cpp's simple-chat example's stream: a reply's end-of-turn tokens "
                   "never decoded), where the full cache answers; the open-turn rows send that stream through the "
                   "server.")
    out += ["", "Wall times include each program's model load. Time to first token is the client's: from "
            "sending the request to the first streamed piece of text.", ""]
    return "\n".join(out)
