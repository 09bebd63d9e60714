#!/usr/bin/env python3
"""A 20-turn chat through 1,024 cells: facts given in turns 1-5 are asked in turns 16-20, after ten
long passages pushed them out of the context (chat_split.json). One flashcache_chat chat-mode run
per policy and split: the full cache, llama.cpp's shift, StreamingLLM, FlashCache without recall,
and FlashCache with the archive and recall (RULE.md stage 4's choice). Nothing is chosen here.

  python3 bench/stream/run_chat_facts.py --chat build/bench/llama_cpp/flashcache_chat \
      --out bench/results/llama_chat_facts.json
"""
import datetime
import json
import os
import random
import subprocess
import sys
import time

import run_stream as rs

HERE = os.path.dirname(os.path.abspath(__file__))

POLICIES = {
    "full": ["--when-full", "none"],
    "shift": ["--when-full", "shift", "--keep", "4"],
    "streaming": ["--when-full", "streaming", "--keep", "4"],
    "flashcache, no recall": ["--when-full", "flashcache", "--no-recall"],
    # The chat's default at stage 4; stage 5 (run_order.py) made position order the default.
    "flashcache + archive and recall": ["--when-full", "flashcache", "--archive-order", "eviction"],
}


def passages(path, count, words_each):
    """`count` passages of about words_each words, each cut at a paragraph's end, one line each."""
    with open(path, encoding="utf-8") as f:
        paras = [" ".join(p.split()) for p in f.read().split("\n\n") if 20 < len(p.split()) <= 1.5 * words_each]
    out, cur = [], []
    for p in paras:
        cur.append(p)
        if sum(len(c.split()) for c in cur) >= words_each:
            out.append(" ".join(cur))
            cur = []
        if len(out) == count:
            break
    return out


def script(doc, chat, words):
    """The 20 user turns, passages of about `words` words, and the five (question turn, code) pairs."""
    rng = random.Random(chat["seed"])
    codes = [f"{rng.randrange(100000, 1000000)}" for _ in doc["objects"]]
    turns = [doc["fact"].format(object=o, number=c) for o, c in zip(doc["objects"], codes)]
    for p in passages(chat["passages_from"], doc["passage_turns"], words):
        turns.append(f"Here is a passage: {p} Summarize it in one sentence.")
    asks = []
    for o, c in zip(doc["objects"], codes):
        asks.append((len(turns), c))
        turns.append(doc["question"].format(object=o))
    return turns, asks


def run(args, policy, turns, cells, turn_end="open"):
    """One chat-mode run. turn_end "open": each reply's end-of-turn tokens are never decoded, as this
    study was measured (llama.cpp's simple-chat example does the same); "close" decodes them, as a
    server that re-reads the formatted chat does (run_server_facts.py)."""
    cmd = [args.chat, "-c", str(cells), "-n", "32", "-t", str(args.threads), "--json", "--turn-end", turn_end]
    cmd += POLICIES[policy]
    if args.model:
        cmd += ["-m", args.model]
    t0 = time.time()
    out = subprocess.run(cmd, input="\n".join(turns) + "\n", capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr[-2000:]}")
    d = json.loads(out.stdout)
    d["wall_s"] = round(time.time() - t0, 2)
    return d


def main():
    args = rs.study_args(__doc__, "llama_chat_facts.json", "/tmp/flashcache_chat_facts")
    with open(os.path.join(HERE, "chat_split.json")) as f:
        doc = json.load(f)
    cache = rs.RowCache(os.path.join(args.work, "rows.jsonl"))
    rows = []

    def one(chat, words, policy):
        turns, asks = script(doc, chat, words)
        cells = 8192 if policy == "full" else doc["cells"]
        d = cache.run(f"{chat['split']}|{words}|{policy}", lambda: run(args, policy, turns, cells))
        found = [code in d["replies"][i] for i, code in asks]
        recalls = d.get("recalls", [])
        row = {"split": chat["split"], "passage_words": words, "policy": policy, "cells": cells,
               "found": sum(found), "of": len(found), "found_by_turn": found,
               "answers": [d["replies"][i] for i, _ in asks], "tokens": d["tokens"], "avg_cells": d["avg_cells"],
               "events": len(d["events"]), "decode_ms": d["decode_ms"], "event_ms": d["event_ms"],
               "recall_ms": sum(r["ms"] for r in recalls), "recall_score_ms": sum(r["score_ms"] for r in recalls),
               "turn_decode_ms": sum(r["turn_decode_ms"] for r in recalls),
               "recalled": sum(r["recalled"] for r in recalls),
               "archive_bytes_max": max((r["archive_bytes"] for r in recalls), default=0),
               "recalls": recalls, "wall_s": d["wall_s"]}
        print(f"{chat['split']} {words} words {policy}: {row['found']}/5 {[a[:30] for a in row['answers']]}",
              file=sys.stderr, flush=True)
        return row

    dev, held = doc["chats"]
    tried, words = [], None
    for w in doc["passage_words"]:  # the precondition: the full cache answers at least 4 of 5 dev facts
        tried.append(one(dev, w, "full"))
        if tried[-1]["found"] >= 4:
            words = w
            break
    rows += tried
    if words is not None:
        for chat in (dev, held):  # dev, then held-out once
            rows += [one(chat, words, p) for p in POLICIES if not (chat is dev and p == "full")]
    out = {"command": "python3 bench/stream/run_chat_facts.py --chat build/bench/llama_cpp/flashcache_chat",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "split": "bench/stream/chat_split.json", "threads": args.threads, "passage_words": words,
           "rows": rows}
    rs.write_json(args.out, out)


if __name__ == "__main__":
    main()
