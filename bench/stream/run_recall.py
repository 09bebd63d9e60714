#!/usr/bin/env python3
"""A fact asked after the context was compressed: archive and recall through a bounded llama.cpp
context, chosen on dev by RULE.md stage 4, then held-out once. Every row is one flashcache_chat run.

  python3 bench/stream/run_recall.py --chat build/bench/llama_cpp/flashcache_chat \
      --out bench/results/llama_recall.json

Facts: the filler of stream_split.json with a 6-digit code at five depths is streamed through 1,024
cells; then the question arrives as a new turn (--ask) and 12 tokens are generated. Streams: the
dev and held-out texts through 1,024 and 2,048 cells with the archive on (positions kept), for the
running-text NLL. Finished runs are kept in --work/rows.jsonl, so an interrupted run resumes.
"""
import datetime
import json
import os
import platform
import random
import sys

import run_stream as rs  # the stream study's runner, tokenizer and facts

HERE = os.path.dirname(os.path.abspath(__file__))

QUESTION = "\n\nQuestion: what is the secret code of the archive?\nAnswer: The secret code of the archive is"
BUDGETS, BLOCKS = (16, 32, 64), (8, 16, 32)


def default_row():
    """The when-full default as flashcache_chat runs it (RULE.md stage 2's choice)."""
    return rs.fc_row(0.75, 0.9)


def recall_row(budget, block, redo="turn", score="exact"):
    row = rs.fc_row(0.75, 0.9, renumber=False, archive=True, recall=budget, block=block, redo=redo)
    if score != "exact":
        row["score"] = score
    return row


def label(row):
    if row.get("archive"):
        return (f"flashcache + archive, recall {row['recall']}, block {row['block']}, redo {row['redo']}" +
                (f", {row['score']} score" if row.get("score") else "")
                if row.get("recall") else "flashcache + archive, no recall")
    return rs.label(row)


def extra_args(row):
    args = rs.policy_args(row)
    if row.get("archive"):
        # Stage 4 ran with the archive in eviction order, the chat's default until stage 5.
        args += ["--archive", "--archive-block", str(row["block"]), "--archive-order", row.get("order", "eviction")]
        if row.get("recall"):
            args += ["--recall", str(row["recall"]), "--redo", "turn" if row["redo"] == "turn" else "last",
                     "--recall-score", row.get("score", "exact")]
    return args


def run(args, path, cells, row, max_tokens=0, generate=12, nll_from=0, ask=""):
    return rs.run_chat(args.chat, args.model, path, cells, row, args.threads, max_tokens=max_tokens,
                       generate=generate, nll_from=nll_from, flags=extra_args(row), ask=ask)


def fact_files(args, split_doc, split, tok):
    """(depth, code, filler path) for the split's five facts; the question comes later."""
    entry = next(f for f in split_doc["facts"] if f["split"] == split)
    with open(entry["path"], encoding="utf-8") as f:
        words = f.read().split()
    rng = random.Random(f"facts-{split}")  # the codes of the stream study's facts
    out = []
    for depth in split_doc["depths"]:
        code = f"{rng.randrange(100000, 1000000)}"
        text = rs.fact_text(words, depth, code, tok, split_doc["fact_prompt_tokens"])
        path = os.path.join(args.work, f"ask-{split}-{depth}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text[:text.index(QUESTION)])
        out.append((depth, code, path, entry["name"]))
    return out


def run_facts(args, cache, facts, split, rows, log):
    out = []
    for depth, code, path, filler in facts:
        for row in rows:
            cells = 4096 if row["policy"] == "full" else 1024
            doc = cache.run(f"ask|{split}|{depth}|{label(row)}", lambda: run(args, path, cells, row, ask=QUESTION))
            hit = code in doc["text"]
            rec = doc.get("recalls", [])
            out.append({"split": split, "filler": filler, "depth": depth, "label": label(row), **row, "cells": cells,
                        "hit": hit, "answer": doc["text"], "events": len(doc["events"]),
                        "avg_cells": doc["avg_cells"], "recall_event": rec[0] if rec else None})
            log(f"ask {split} depth {depth} {label(row)}: {'hit' if hit else 'miss'} ({doc['text'][:40]!r})")
    return out


def run_streams(args, cache, split_doc, split, rows, log):
    entry = next(s for s in split_doc["streams"] if s["split"] == split)
    n = split_doc["max_tokens"]
    out = []
    for cells in (1024, 2048):
        for row in rows:
            # Positions are kept with the archive: nothing is generated after the stream's last
            # position, which is the model's training length - 1.
            doc = cache.run(f"stream|{split}|{cells}|{label(row)}",
                            lambda: run(args, entry["path"], cells, row, max_tokens=n, generate=0, nll_from=cells))
            out.append({"split": split, "text": entry["name"], "cells": cells, "label": label(row), **row,
                        **rs.summarize(doc)})
            log(f"stream {split} {cells} {label(row)}: nll {doc['stream_nll']:.4f}, avg cells {doc['avg_cells']:.0f}")
    return out


def hits(rows, lab):
    return sum(r["hit"] for r in rows if r["label"] == lab)


def main():
    args = rs.study_args(__doc__, "llama_recall.json", "/tmp/flashcache_recall")
    with open(os.path.join(HERE, "stream_split.json")) as f:
        split_doc = json.load(f)
    tok = rs.tokenizer(args.model)
    cache = rs.RowCache(os.path.join(args.work, "rows.jsonl"))
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    # Dev (RULE.md stage 4, steps 1-3).
    dev_facts_in = fact_files(args, split_doc, "dev", tok)
    cands = [recall_row(b, k) for b in BUDGETS for k in BLOCKS]
    dev = run_facts(args, cache, dev_facts_in, "dev", [{"policy": "full"}, default_row()] + cands, log)
    best = max(hits(dev, label(c)) for c in cands)
    tied = [c for c in cands if hits(dev, label(c)) == best]
    pick = min(tied, key=lambda c: (c["recall"], -c["block"]))
    last = recall_row(pick["recall"], pick["block"], "last")
    dev += run_facts(args, cache, dev_facts_in, "dev", [last], log)
    if hits(dev, label(last)) >= hits(dev, label(pick)):
        pick = last
    log(f"chosen {label(pick)}")
    dev_streams = run_streams(args, cache, split_doc, "dev", [recall_row(pick["recall"], pick["block"], pick["redo"])],
                              log)
    # Step 4: the default's dev stream NLL as stage 2 recorded it.
    with open(os.path.join(rs.ROOT, "bench", "results", "llama_stream.json")) as f:
        stage2 = json.load(f)
    default_nll = {r["cells"]: r["stream_nll"] for r in stage2["streams"]
                   if r["split"] == "dev" and r["label"] == rs.label(default_row())}
    nll_ok = all(r["stream_nll"] <= default_nll[r["cells"]] + 0.01 for r in dev_streams)
    on_by_default = hits(dev, label(pick)) >= 4 and nll_ok
    log(f"recall on by default: {on_by_default} (dev hits {hits(dev, label(pick))}, nll {nll_ok})")

    # Held-out, once, with the choice.
    held_in = fact_files(args, split_doc, "heldout", tok)
    held = run_facts(args, cache, held_in, "heldout",
                     [{"policy": "full"}, default_row(), pick, {"policy": "shift"}, {"policy": "streaming"}], log)
    held_streams = run_streams(args, cache, split_doc, "heldout", [pick], log)
    held_default = {r["cells"]: r["stream_nll"] for r in stage2["streams"]
                    if r["split"] == "heldout" and r["label"] == rs.label(default_row())}

    # Stage 4b: the digest at the chosen setting, on dev; held-out once if it wins.
    digest = dict(pick, score="digest")
    dev += run_facts(args, cache, dev_facts_in, "dev", [digest], log)

    def median_score_ms(rows, lab):
        ms = sorted(r["recall_event"]["score_ms"] for r in rows if r["label"] == lab and r["recall_event"])
        return ms[len(ms) // 2] if ms else float("inf")
    digest_wins = (hits(dev, label(digest)) >= hits(dev, label(pick)) and
                   median_score_ms(dev, label(digest)) < median_score_ms(dev, label(pick)))
    log(f"digest wins: {digest_wins} (dev hits {hits(dev, label(digest))}, median score ms "
        f"{median_score_ms(dev, label(digest)):.1f} against {median_score_ms(dev, label(pick)):.1f})")
    if digest_wins:
        held += run_facts(args, cache, held_in, "heldout", [digest], log)

    doc = {
        "command": "python3 bench/stream/run_recall.py --chat build/bench/llama_cpp/flashcache_chat",
        "date": started,
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "model": os.path.basename(args.model), "threads": args.threads, "chunk": rs.CHUNK,
        "split": "bench/stream/stream_split.json", "rule": "bench/stream/RULE.md (stage 4)",
        "question": QUESTION,
        "choice": {"candidates": [{"label": label(c), "dev_hits": hits(dev, label(c))} for c in cands + [last]],
                   "chosen": label(pick), "row": pick, "dev_default_nll": default_nll,
                   "on_by_default": on_by_default},
        "heldout_default_nll": held_default,
        "digest_choice": {"label": label(digest), "dev_hits": hits(dev, label(digest)), "wins": digest_wins,
                          "dev_median_score_ms": median_score_ms(dev, label(digest)),
                          "dev_median_score_ms_exact": median_score_ms(dev, label(pick))},
        "facts": dev + held, "streams": dev_streams + held_streams,
    }
    rs.write_json(args.out, doc)


if __name__ == "__main__":
    main()
