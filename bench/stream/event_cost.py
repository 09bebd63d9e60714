#!/usr/bin/env python3
"""What one compaction costs in a running llama.cpp context: the dev stream
(bench/stream/stream_split.json) through 1,024 cells with the when-full defaults, query-free and with
query tails (--query-tail), from the generic build and from a FLASHCACHE_NATIVE=ON build, each
compaction's time against the decode time since the previous one. Run it on an otherwise idle machine.

  python3 bench/stream/event_cost.py --generic build/bench/llama_cpp/flashcache_chat \\
      --native build-native/bench/llama_cpp/flashcache_chat --out bench/results/llama_event_cost.json
"""
import argparse
import datetime
import json
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


def run(chat, path, tail):
    cmd = [chat, "-f", path, "-c", "1024", "-b", "128", "-n", "8", "-t", "2", "--json", "--max-tokens", "8192",
           "--nll-from", "1024", "--when-full", "flashcache"] + (["--query-tail"] if tail else ["--no-recall"])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=True)
    d = json.loads(out.stdout)
    shares, last = [], 0.0
    for e in d["events"]:
        shares.append(e["ms"] / (e["decode_ms_before"] - last))
        last = e["decode_ms_before"]
    med = lambda xs: sorted(xs)[len(xs) // 2]
    return {"command": " ".join(os.path.relpath(c) if os.path.exists(c) else c for c in cmd),
            "stream_nll": d["stream_nll"], "events": len(d["events"]),
            "event_ms_median": med([e["ms"] for e in d["events"]]),
            **{f"{step}_ms_median": med([e[f"{step}_ms"] for e in d["events"]])
               for step in ("read", "score", "select", "write")},
            # the event beyond the compaction itself: llama_memory_seq_add's renumbering
            "renumber_ms_median": med([e["ms"] - e["compress_ms"] for e in d["events"]]),
            "event_share_median": med(shares), "decode_ms": d["decode_ms"], "tokens_per_s": d["tokens_per_s"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--generic", required=True)
    ap.add_argument("--native", required=True)
    ap.add_argument("--out", default=os.path.join(HERE, "..", "results", "llama_event_cost.json"))
    args = ap.parse_args()
    with open(os.path.join(HERE, "stream_split.json")) as f:
        split = json.load(f)
    path = next(s["path"] for s in split["streams"] if s["split"] == "dev")
    rows = []
    for build, chat in (("generic", args.generic), ("native", args.native)):
        for tail in (False, True):
            rows.append({"build": build, "score": "query tails" if tail else "query-free", **run(chat, path, tail)})
    doc = {"command": "python3 bench/stream/event_cost.py", "date": datetime.datetime.now(
        datetime.timezone.utc).isoformat(timespec="seconds"), "cpus": os.cpu_count(),
        "loadavg_after": open("/proc/loadavg").read().split()[0], "threads": 2, "cells": 1024,
        "stream": os.path.basename(path), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
