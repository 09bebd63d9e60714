#!/usr/bin/env python3
"""RULE.md stage 5: the archive kept in position order against eviction order, at stage 4's recall
choice, on the dev facts asked later and the dev 20-turn chat; then held-out once with the choice.

  python3 bench/stream/run_order.py --chat build/bench/llama_cpp/flashcache_chat \
      --out bench/results/llama_recall_order.json
"""
import datetime
import json
import os
import sys

import run_chat_facts as chat
import run_recall as recall
import run_stream as rs

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    args = rs.study_args(__doc__, "llama_recall_order.json", "/tmp/flashcache_order")
    with open(os.path.join(HERE, "stream_split.json")) as f:
        split_doc = json.load(f)
    with open(os.path.join(HERE, "chat_split.json")) as f:
        chat_doc = json.load(f)
    with open(os.path.join(rs.ROOT, "bench", "results", "llama_recall.json")) as f:
        stage4 = json.load(f)
    with open(os.path.join(rs.ROOT, "bench", "results", "llama_chat_facts.json")) as f:
        chat4 = json.load(f)
    tok = rs.tokenizer(args.model)
    cache = rs.RowCache(os.path.join(args.work, "rows.jsonl"))
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    pick = stage4["choice"]["row"]
    by_pos = dict(pick, order="position")

    def flags(row):
        return recall.extra_args(row)  # with --archive-order from the row

    def facts(split):
        rows = []
        for depth, code, path, _filler in recall.fact_files(args, split_doc, split, tok):
            doc = cache.run(f"ask|{split}|{depth}|position", lambda: rs.run_chat(
                args.chat, args.model, path, 1024, by_pos, args.threads, generate=12, flags=flags(by_pos),
                ask=recall.QUESTION))
            rows.append({"split": split, "depth": depth, "hit": code in doc["text"], "answer": doc["text"],
                         "recall_event": (doc.get("recalls") or [None])[0]})
            log(f"ask {split} {depth} position: {rows[-1]['hit']} {doc['text'][:30]!r}")
        return rows

    def chat_row(which):
        split = next(c for c in chat_doc["chats"] if c["split"] == which)
        turns, asks = chat.script(chat_doc, split, chat4["passage_words"])
        chat.POLICIES["flashcache + archive and recall, position order"] = ["--when-full", "flashcache",
                                                                            "--archive-order", "position"]
        d = cache.run(f"chat|{which}|position", lambda: chat.run(
            args, "flashcache + archive and recall, position order", turns, chat_doc["cells"]))
        found = [code in d["replies"][i] for i, code in asks]
        log(f"chat {which} position: {sum(found)}/5 {[d['replies'][i][:30] for i, _ in asks]}")
        return {"split": which, "found": sum(found), "answers": [d["replies"][i] for i, _ in asks],
                "recalls": d.get("recalls", [])}

    def hits_of(rows, split, label):
        return sum(r["hit"] for r in rows if r["split"] == split and r["label"] == label)

    dev_facts, dev_chat = facts("dev"), chat_row("dev")
    eviction_dev_facts = hits_of(stage4["facts"], "dev", stage4["choice"]["chosen"])
    eviction_dev_chat = next(r["found"] for r in chat4["rows"]
                             if r["split"] == "dev" and r["policy"] == "flashcache + archive and recall")
    wins = sum(r["hit"] for r in dev_facts) >= eviction_dev_facts and dev_chat["found"] > eviction_dev_chat
    log(f"position order wins: {wins}")
    held_facts = held_chat = None
    if wins:
        held_facts, held_chat = facts("heldout"), chat_row("heldout")
    out = {"command": "python3 bench/stream/run_order.py --chat build/bench/llama_cpp/flashcache_chat",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "rule": "bench/stream/RULE.md (stage 5)", "threads": args.threads, "setting": pick,
           "eviction": {"dev_facts": eviction_dev_facts, "dev_chat": eviction_dev_chat,
                        "heldout_facts": hits_of(stage4["facts"], "heldout", stage4["choice"]["chosen"]),
                        "heldout_chat": next(r["found"] for r in chat4["rows"] if r["split"] == "heldout" and
                                             r["policy"] == "flashcache + archive and recall")},
           "position": {"dev_facts": sum(r["hit"] for r in dev_facts), "dev_chat": dev_chat["found"],
                        "heldout_facts": sum(r["hit"] for r in held_facts) if held_facts else None,
                        "heldout_chat": held_chat["found"] if held_chat else None},
           "wins": wins, "facts": dev_facts + (held_facts or []),
           "chats": [dev_chat] + ([held_chat] if held_chat else [])}
    rs.write_json(args.out, out)


if __name__ == "__main__":
    main()
