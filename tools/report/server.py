"""RESULTS.md's "Through the server" section, from bench/results/server_facts.json (written by
bench/stream/run_server_facts.py): the 20-turn facts chat through flashcache.server beside the C++
chat program, in the same run."""


def _mean(values):
    return sum(values) / len(values) if values else 0.0


def render(doc):
    rows = doc["rows"]
    out = ["## Through the server: the 20-turn facts chat with an OpenAI client", "",
           "The chat of `bench/stream/chat_split.json`: facts given in turns 1-5, passages of "
           f"{doc['passage_words']} words in turns 6-15, the facts asked in turns 16-20, greedy replies of at most "
           "32 tokens, through `python -m flashcache.server` with the `openai` client (each turn streamed, "
           "the whole conversation resent) and, in the same run, through the C++ chat program "
           f"(`flashcache_chat`) on the same turns. {doc['threads']} llama.cpp thread(s); {doc['machine']}; "
           f"{doc['date']}; command `{doc['command']}`. Nothing was chosen on these runs.", ""]
    out += ["| split | row | cells | facts found | wall s | s per turn | first token, turns 1-5 (s) | "
            "first token, turns 16-20 (s) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        per_turn = r["wall_s"] / 20
        early = f"{_mean(r['ttft_s'][:5]):.2f}" if r.get("ttft_s") else ""
        late = f"{_mean(r['ttft_s'][15:]):.2f}" if r.get("ttft_s") else ""
        out.append(f"| {r['split']} | {r['row']} | {r['cells']} | {r['found']} of {r['of']} | {r['wall_s']:.1f} | "
                   f"{per_turn:.2f} | {early} | {late} |")
    out.append("")
    for split in sorted({r["split"] for r in rows}):
        cpp = [r for r in rows if r["split"] == split and r["row"].startswith("C++ chat") and "defaults" in r["row"]]
        srv = [r for r in rows if r["split"] == split and "defaults" in r["row"] and r["row"].startswith("server")]
        if cpp and srv:
            out.append(f"- {split}: the server's wall time is {srv[0]['wall_s'] / cpp[0]['wall_s']:.2f} times the "
                       "C++ chat program's for the same 20 turns and policy (the Python layer, the chat template, "
                       "HTTP and the resent conversation's prefix match, beside a process per run).")
        full_cpp = [r for r in rows if r["split"] == split and r["row"] == "C++ chat: full"]
        full_srv = [r for r in rows if r["split"] == split and r["row"] == "server: full cache"]
        if full_cpp and full_srv and full_srv[0]["found"] < full_cpp[0]["found"]:
            out.append(f"- {split}: with the full cache the server finds {full_srv[0]['found']} of 5 where the C++ "
                       f"program finds {full_cpp[0]['found']} of 5, so here the facts measure the two decoding "
                       "paths, not compression or recall: on the same turns, llama-cpp-python's greedy replies "
                       "part from the C++ program's inside turn 6 (the first passage), and the model's later "
                       "answers differ. Stock llama-cpp-python, with the same template and settings, gives the "
                       "server's Llama's replies word for word (checked over the first 8 turns), so the "
                       "difference lies in llama-cpp-python's decoding path, not in flashcache's; not explained "
                       "further yet.")
    out += ["", "Wall times include each program's model load. Time to first token is the client's: from "
            "sending the request to the first streamed piece of text.", ""]
    return "\n".join(out)
