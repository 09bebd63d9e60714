#!/usr/bin/env python3
"""The passkey templates through llama.cpp, on SmolLM2 and Gemma 3 side by side (PASSKEY_RULE.md,
written before the first run): the held-out templates of bench/quality/passkey_split.json, their
5 trials, each prompt prefilled once by flashcache_policies and every row x keep ratio made from it.

  python3 bench/stream/run_passkey_llama.py --policies build/bench/llama_cpp/flashcache_policies

Per template and model: the full cache at each of the model's lengths, longest first, until one
finds at least 4 of the 5 keys (long_eval.py's rule); at that length every row x keep ratio runs the
5 trials. A row the adapter refuses (a budget below Gemma's sliding window) is reported as refused.
Finished prefills are kept in --work/rows.jsonl, so an interrupted run resumes.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "quality"))
import long_eval as le  # noqa: E402  (the templates' prompts and the hit rule)
import run_second_model as second  # noqa: E402
import run_stream as rs  # noqa: E402

POLICIES = ["flashcache", "paper", "query-tail", "streaming"]
RATIOS = [0.1, 0.2]
# Each model's lengths, longest first. Gemma's sliding layers keep the last 512 positions (protected
# for every row), which at SmolLM2's 512-2,048 tokens would leave nothing to choose at keep 0.1/0.2.
MODELS = {"smollm2": {"name": "SmolLM2-135M-Instruct (Q4_1)", "lengths": [2048, 1024, 512], "find": rs.find_model},
          "gemma3": {"name": second.MODEL, "lengths": [8192, 4096], "find": second.find_gemma3}}


class Tokens:
    """long_eval.passkey_prompt's tokenizer: encode() without BOS, with the model's own vocabulary."""

    def __init__(self, model):
        import llama_cpp
        self.llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)

    def encode(self, text):
        return self.llm.tokenize(text.encode(), add_bos=False)


def run_prompt(args, model, path):
    cmd = [args.policies, "--model", model, "--prompt-file", path, "--keep-ratios", ",".join(map(str, RATIOS)),
           "--policies", ",".join(["full"] + POLICIES), "--max-new", str(le.PASSKEY_ANSWER_TOKENS),
           "--threads", str(args.threads)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({run.returncode}): {run.stderr.strip()}")
    return json.loads(run.stdout)


def row_of(doc, policy, ratio):
    """flashcache_policies' row of `policy` at `ratio` (the full cache has one row)."""
    return next(r for r in doc["rows"] if r["policy"] == policy and (policy == "full" or abs(r["keep_ratio"] - ratio) < 1e-9))


def run_model(args, key, templates, cache, log):
    spec = MODELS[key]
    model = spec["find"]()
    tok = Tokens(model)
    out = []
    for t in templates:
        word = t["key_format"] == "word"

        def hit(doc, trial, policy, ratio=1.0):  # None: refused
            row = row_of(doc, policy, ratio)
            return None if "refused" in row else le.passkey_hit(row["text"], trial["keys"], trial["ask"], word)

        chosen, full_hits, too_long = None, {}, []
        for length in spec["lengths"]:
            try:
                texts = [le.passkey_prompt(tok, t, trial, length)[0] for trial in t["trials"]]
            except SystemExit as e:  # a text filler shorter than the length: the next length
                too_long.append(length)
                log(f"{key} {t['name']} at {length}: {e}")
                continue
            docs = []
            for i, text in enumerate(texts):
                path = os.path.join(args.work, f"{key}-{t['name']}-{length}-{i}.txt")
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
                docs.append(cache.run(f"{key}|{t['name']}|{length}|{i}", lambda: run_prompt(args, model, path)))
            full_hits[length] = sum(hit(d, tr, "full") for d, tr in zip(docs, t["trials"]))
            log(f"{key} {t['name']} at {length}: full cache {full_hits[length]}/5")
            if full_hits[length] >= 4:
                chosen = (length, docs)
                break
        entry = {"model": key, "template": t["name"], "kind": t["kind"], "key_format": t["key_format"],
                 "full_cache_hits": full_hits, "length": chosen[0] if chosen else None,
                 "filler_too_short_for": too_long}
        if chosen is None:
            out.append(dict(entry, skipped="the full cache finds fewer than 4 of 5 keys at every length"))
            continue
        length, docs = chosen
        entry["prompt_tokens"] = [d["prompt_tokens"] for d in docs]
        entry["prefill_ms"] = [round(d["prefill_ms"]) for d in docs]
        hits, refused = {"full": full_hits[length]}, {}
        answers = {"full": [row_of(d, "full", 1)["text"] for d in docs]}
        for policy in POLICIES:
            for ratio in RATIOS:
                name = f"{policy}@{ratio:g}"
                found = [hit(d, tr, policy, ratio) for d, tr in zip(docs, t["trials"])]
                rows = [row_of(d, policy, ratio) for d in docs]
                hits[name] = None if None in found else sum(found)
                answers[name] = [r.get("text", "") for r in rows]
                if None in found:
                    refused[name] = next(r["refused"] for r in rows if "refused" in r)
        entry.update(hits=hits, refused=refused, answers=answers)
        log(f"{key} {t['name']} at {length}: " +
            ", ".join(f"{n} {'refused' if v is None else v}" for n, v in hits.items()))
        out.append(entry)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policies", required=True, help="the flashcache_policies binary")
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "llama_passkey.json"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default="/tmp/flashcache_passkey_llama")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    split = le.load_passkey_split()
    templates = [t for t in split["templates"] if t["split"] == "heldout"]
    cache = rs.RowCache(os.path.join(args.work, "rows.jsonl"))
    t0 = time.time()

    def log(msg):
        print(f"[{time.time() - t0:6.0f}s] {msg}", file=sys.stderr, flush=True)

    results = []
    for key in args.models.split(","):
        results += run_model(args, key, templates, cache, log)
    rs.write_json(args.out, {
        "command": "python3 bench/stream/run_passkey_llama.py --policies build/bench/llama_cpp/flashcache_policies",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "threads": args.threads,
        "rule": "bench/stream/PASSKEY_RULE.md", "split": "bench/quality/passkey_split.json (held-out templates)",
        "models": {k: {"name": MODELS[k]["name"], "lengths": MODELS[k]["lengths"]} for k in args.models.split(",")},
        "rows": ["full"] + [f"{p}@{r:g}" for p in POLICIES for r in RATIOS],
        "answer_tokens": le.PASSKEY_ANSWER_TOKENS, "templates": results, "seconds": round(time.time() - t0)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
