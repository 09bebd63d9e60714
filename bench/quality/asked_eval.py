#!/usr/bin/env python3
"""Passkeys asked later: the context is compressed before the question exists.

The passkey templates of bench/quality/passkey_split.json (long_eval.py's), in the
protocol of bench/quality/study/ASKED_RULE.md: the context (the prompt without its
question) is prefilled and compressed; the question then arrives as a new turn and is
decoded over the compressed cache with its queries and keys captured; for the recall rows
``flashcache recall`` scores the evicted tokens with them, what it brings back joins the
kept tokens (each KV head may then hold a different number: a ragged cache), and the
question is decoded again (or only its last token); the answer is the next 8 greedy
tokens. The full cache runs the same two turns uncompressed.

Rows: full; the library's defaults; the paper's exact algorithm; the query tails; SnapKV
and H2O (their observation window is the context's end); a KVzip-style score (a second
prefill of "Repeat the previous context:" and the context over the full cache, each key's
largest attention probability from those queries; computed here, selected with the
default protected set); and recall variants on top of the defaults, labelled
``recall-R-bB[-shared][-last][-digest]`` (R tokens per KV head, blocks of B, one ranking
for all heads, redo only the question's last token, Quest's bound instead of the exact
score).

    asked_eval.py --split dev --study           # every recall variant (the study's rows)
    asked_eval.py --split heldout --recall-rows recall-64-b32

``--tiny`` is the CI check of the harness (one template, 256 tokens, two trials).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one BLAS thread per worker: --jobs runs several

import argparse  # noqa: E402
import datetime  # noqa: E402
import multiprocessing  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Dict, List, Optional, Sequence, Tuple  # noqa: E402

import long_eval as le  # noqa: E402
import numpy as np  # noqa: E402
from smollm2 import KVCache  # noqa: E402

RULE_FILE = "bench/quality/study/ASKED_RULE.md"
REPEAT_PROMPT = "\n\nRepeat the previous context:\n"
SINK = le.DEFAULT["sink"]
WINDOW_SHARE = le.DEFAULT["window_share"]


def compressed_rows() -> List[Tuple[str, str, Dict]]:
    """The rows select_configs computes: (label, policy, options)."""
    prot = le.protected(le.DEFAULT)
    return [("defaults", "flashcache", dict(le.DEFAULT)),
            ("paper", "flashcache", dict(le.PAPER)),
            ("query-tail", "flashcache", dict(le.DEFAULT, query="tail")),
            ("snapkv", "snapkv", dict(prot, allocation="uniform")),
            ("h2o", "h2o", dict(prot, allocation="uniform"))]


@dataclass(frozen=True)
class Recall:
    """One recall variant on top of the defaults' kept tokens."""
    label: str
    budget: int          # tokens per (layer, KV head)
    block: int
    shared: bool         # one ranking of positions for every layer and KV head
    digest: bool         # Quest's bound instead of the best token's probability
    redo_last: bool      # decode only the question's last token again

    @staticmethod
    def parse(label: str) -> "Recall":
        m = re.fullmatch(r"recall-(\d+)-b(\d+)((?:-shared|-last|-digest)*)", label)
        if not m:
            raise SystemExit(f"asked_eval: {label!r} is no recall row (recall-R-bB[-shared][-last][-digest])")
        flags = m.group(3)
        return Recall(label, int(m.group(1)), int(m.group(2)), "-shared" in flags, "-digest" in flags,
                      "-last" in flags)

    def cli_key(self) -> Tuple:
        """What the CLI call depends on (the redo does not)."""
        return (self.budget, self.block, self.shared, self.digest)


# The recall rows a template's summary line names (the rest are in the JSON).
ROWS_TO_LOG = ("recall-32-b16", "recall-64-b32", "recall-64-b16")


def study_recalls() -> List[Recall]:
    out = []
    for r in (16, 32, 64):
        for b in (8, 16, 32):
            base = f"recall-{r}-b{b}"
            out += [Recall.parse(base + s) for s in ("", "-shared", "-last", "-digest")]
    return out


# ----------------------------------------------------------------------------------------
# Scores and caches.
# ----------------------------------------------------------------------------------------

def kvzip_scores(q: np.ndarray, k_ctx: Sequence[np.ndarray], k_rep: np.ndarray, group: int) -> List[np.ndarray]:
    """Per layer [Hkv, P]: each context key's largest attention probability from the
    repeat chunk's queries q [L, Hq, R, d], over the context keys and, causally, the
    chunk's own keys k_rep [L, Hkv, R, d]."""
    out = []
    for l, ctx in enumerate(k_ctx):
        hkv, p, d = ctx.shape
        r = k_rep.shape[2]
        causal = np.triu(np.full((r, r), -np.inf, np.float32), k=1)
        layer = np.empty((hkv, p), np.float32)
        for h in range(hkv):
            qg = q[l, h * group:(h + 1) * group] / np.float32(np.sqrt(d))          # [g, R, d]
            s = np.concatenate([qg @ ctx[h].T, qg @ k_rep[l, h].T + causal], axis=-1)  # [g, R, P + R]
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            layer[h] = s[:, :, :p].max(axis=(0, 1))
        out.append(layer)
    return out


def protected_top(scores: np.ndarray, budget: int) -> np.ndarray:
    """[H, budget] ascending: the default protected set (the first SINK tokens and the
    newest round(WINDOW_SHARE * budget)), then the highest scores among the rest."""
    hkv, p = scores.shape
    window = int(np.floor(WINDOW_SHARE * budget + 0.5))
    sink = min(SINK, budget - window)
    rows = []
    for h in range(hkv):
        middle = np.arange(sink, p - window)
        top = middle[np.argsort(-scores[h, sink:p - window], kind="stable")[:budget - sink - window]]
        rows.append(np.sort(np.concatenate([np.arange(sink), top, np.arange(p - window, p)])))
    return np.stack(rows)


def run_recall(cli: str, work: str, keep: Sequence[np.ndarray], qf, rc: Recall) -> List[List[np.ndarray]]:
    """``flashcache recall`` over the kept tokens ``keep[l]`` [H, B_l] with the question's
    captured queries and keys: per (layer, KV head) the recalled token indices."""
    kept_dir = os.path.join(work, "kept")
    os.makedirs(kept_dir, exist_ok=True)
    for l, idx in enumerate(keep):
        np.save(os.path.join(kept_dir, f"kept_{l}.npy"), np.ascontiguousarray(idx, np.int64))
    np.save(os.path.join(work, "q.npy"), np.ascontiguousarray(qf.q))
    np.save(os.path.join(work, "qk.npy"), np.ascontiguousarray(qf.k))
    out = os.path.join(work, "recalled")
    cmd = [cli, "recall", "--k", os.path.join(work, "k.npy"), "--kept", kept_dir, "--q", os.path.join(work, "q.npy"),
           "--question-k", os.path.join(work, "qk.npy"), "--recall", str(rc.budget), "--block", str(rc.block),
           "--score", "digest" if rc.digest else "exact", "--out", out, "--force"]
    if rc.shared:
        cmd.append("--shared")
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"flashcache recall failed: {run.stderr.strip()}")
    return [[row[row >= 0] for row in np.load(os.path.join(out, f"recalled_{l}.npy"))] for l in range(len(keep))]


def with_recalled(keep: Sequence[np.ndarray], recalled: Sequence[Sequence[np.ndarray]]) -> List[List[np.ndarray]]:
    return [[np.union1d(k_h, r_h) for k_h, r_h in zip(k_l, r_l)] for k_l, r_l in zip(keep, recalled)]


def question_again(m, cache: KVCache, q_ids: Sequence[int], qf, redo_last: bool):
    """Decodes the question over ``cache`` (kept plus recalled): all of it, or only its
    last token over the question's other keys and values as first decoded (qf)."""
    if not redo_last:
        return m.forward(q_ids, cache, all_logits=False)
    n = len(q_ids) - 1
    ks = [np.concatenate([k, qk[:, :n]], axis=1) for k, qk in zip(cache.k, qf.k)]
    vs = [np.concatenate([v, qv[:, :n]], axis=1) for v, qv in zip(cache.v, qf.v)]
    bias = None if cache.bias is None else [np.concatenate([b, np.zeros((b.shape[0], n), np.float32)], axis=1)
                                            for b in cache.bias]
    return m.forward(q_ids[-1:], KVCache(ks, vs, cache.next_position + n, bias), all_logits=False)


# ----------------------------------------------------------------------------------------
# One template.
# ----------------------------------------------------------------------------------------

@dataclass
class Trial:
    trial: Dict
    ctx_ids: List[int]
    q_ids: List[int]
    needle: List[int]
    pre: object          # the context's forward pass (cache and queries)
    full: object         # the question over the full cache


def prepare(m, template: Dict, trial: Dict, target: int) -> Trial:
    tok = m.tokenizer
    text, spans = le.passkey_prompt(tok, template, trial, target)
    question = template["questions"][trial["ask"]]
    context = text[:len(text) - len(question)]
    ctx_ids, q_ids = tok.encode(context), tok.encode(question)  # the question is a turn of its own
    needle = le.token_positions(tok, ctx_ids, context, spans[trial["ask"]])
    pre = m.forward(ctx_ids, capture=True, all_logits=False)
    return Trial(trial, ctx_ids, q_ids, needle, pre, m.forward(q_ids, pre.cache, all_logits=False))


def hit(m, template: Dict, t: Trial, out: Sequence[int]) -> bool:
    return le.passkey_hit(m.tokenizer.decode(out), t.trial["keys"], t.trial["ask"], template["key_format"] == "word")


def run_template(args: Tuple) -> Tuple[List[Dict], Dict, List[str]]:
    template, lengths, ratios, recalls, select_bin, cli, n_trials = args
    m = le.model()
    log: List[str] = []

    def say(line: str) -> None:  # progress as it comes, and the line for the summary
        print(line, flush=True)
        log.append(line)

    entry = {"split": template["split"], "kind": template["kind"], "full_cache_hits": {}, "length": None,
             "seconds": {}}
    chosen = None
    for target in sorted(lengths, reverse=True):
        t0 = time.time()
        trials = [prepare(m, template, tr, target) for tr in template["trials"][:n_trials]]
        hits = sum(hit(m, template, t, le.greedy_many(m, [t.full.cache], t.full.logits[-1],
                                                      le.PASSKEY_ANSWER_TOKENS)[0]) for t in trials)
        full_hits = hits
        entry["full_cache_hits"][str(target)] = hits
        entry["seconds"][f"full_{target}"] = round(time.time() - t0, 1)
        say(f"[asked] {template['name']} ({template['split']}): full cache at ~{target}: {hits}/{len(trials)}")
        if hits >= len(trials) - 1:
            chosen = (target, trials)
            break
    if chosen is None:
        entry["skipped"] = "the full cache misses more than one key at every length"
        say(f"[asked] {template['name']}: skipped")
        return [], entry, log
    target, trials = chosen
    entry["length"] = target
    entry["prompt_tokens"] = [len(t.ctx_ids) + len(t.q_ids) for t in trials]
    t0 = time.time()
    hits: Dict[Tuple[str, float], int] = {}
    share: Dict[Tuple[str, float], List[float]] = {}
    by_cli: Dict[Tuple, List[Recall]] = {}
    for rc in recalls:
        by_cli.setdefault(rc.cli_key(), []).append(rc)
    for i, t in enumerate(trials):
        say(f"[asked] {template['name']}: trial {i + 1}/{len(trials)} ({time.time() - t0:.0f}s)")
        p = len(t.ctx_ids)
        configs, meta = le.configs_for(compressed_rows(), ratios, p)
        rep = m.forward(m.tokenizer.encode(REPEAT_PROMPT) + t.ctx_ids, t.pre.cache, capture=True, all_logits=False)
        kvz = kvzip_scores(rep.q, t.pre.cache.k, rep.k, m.group)
        with tempfile.TemporaryDirectory(prefix="asked_eval_") as work:
            le.save_cache(work, t.pre.cache, t.pre.q)
            kept = le.select(select_bin, work, configs)
            for r in ratios:
                entries = []   # (label, cache after the question, its last logits, what the heads hold)
                for cid, (label, _, _, ratio) in meta.items():
                    if ratio == r:
                        keep = kept[cid][0]
                        qf = m.forward(t.q_ids, t.pre.cache.gather(keep), capture=True, all_logits=False)
                        entries.append((label, qf.cache, qf.logits[-1], keep))
                        if label == "defaults":
                            for group in by_cli.values():
                                recalled = run_recall(cli, work, keep, qf, group[0])
                                union = with_recalled(keep, recalled)
                                cache = t.pre.cache.ragged(union)
                                for rc in group:
                                    again = question_again(m, cache, t.q_ids, qf, rc.redo_last)
                                    entries.append((rc.label, again.cache, again.logits[-1], union))
                keep = [protected_top(s, le.per_head_budget(r, p)) for s in kvz]
                qf = m.forward(t.q_ids, t.pre.cache.gather(keep), capture=True, all_logits=False)
                entries.append(("kvzip", qf.cache, qf.logits[-1], keep))
                outs = le.greedy_many(m, [e[1] for e in entries], [e[2] for e in entries], le.PASSKEY_ANSWER_TOKENS)
                for (label, _, _, keep), out in zip(entries, outs):
                    hits[(label, r)] = hits.get((label, r), 0) + hit(m, template, t, out)
                    share.setdefault((label, r), []).append(le.kept_share(keep, t.needle))
    entry["seconds"]["rows"] = round(time.time() - t0, 1)
    base = {"part": "asked", "model": le.MODEL, "split": template["split"], "template": template["name"],
            "kind": template["kind"], "key_format": template["key_format"], "prompt_tokens": target,
            "trials": len(trials)}
    recs = [dict(base, label="full", keep_ratio=1.0, metric="passkey_hits", value=full_hits)]
    for (label, r), n in hits.items():
        recs.append(dict(base, label=label, keep_ratio=r, metric="passkey_hits", value=n))
        recs.append(dict(base, label=label, keep_ratio=r, metric="needle_kept_share",
                         value=float(np.mean(share[(label, r)]))))
    say(f"[asked] {template['name']} at ~{target}: {entry['seconds']['rows']:.0f}s; full {full_hits}/"
               f"{len(trials)}; " + ", ".join(f"{l}@{r:g} {n}" for (l, r), n in hits.items()
                                                 if not l.startswith("recall-") or l in ROWS_TO_LOG))
    return recs, entry, log



def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--select", default=os.path.join(le.REPO, "build-quality-eval", "select_configs"))
    ap.add_argument("--cli", default=os.path.join(le.REPO, "build-quality-eval", "flashcache", "tools", "cli",
                                                  "flashcache"))
    ap.add_argument("--split", choices=["dev", "heldout"], default="dev")
    ap.add_argument("--templates", default="", help="comma-separated template names (default: the split's)")
    ap.add_argument("--lengths", default="1024", help="the longest where the full cache misses at most one key")
    ap.add_argument("--ratios", default="0.1,0.2")
    ap.add_argument("--study", action="store_true", help="every recall variant of ASKED_RULE.md")
    ap.add_argument("--recall-rows", default="", help="comma-separated recall rows, e.g. recall-64-b32")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes, one template each")
    ap.add_argument("--out", default=None)
    ap.add_argument("--tiny", action="store_true", help="CI: one template, 256 tokens, 2 trials, 2 recall rows")
    args = ap.parse_args(argv)

    le.check_defaults(args.cli)
    split = le.load_passkey_split()
    templates = [t for t in split["templates"] if t["split"] == args.split]
    if args.templates:
        names = args.templates.split(",")
        unknown = set(names) - {t["name"] for t in split["templates"]}
        if unknown:
            raise SystemExit(f"asked_eval: unknown templates {sorted(unknown)}")
        templates = [t for t in split["templates"] if t["name"] in names]
    recalls = study_recalls() if args.study else [Recall.parse(x) for x in args.recall_rows.split(",") if x]
    lengths, ratios, n_trials = [int(x) for x in args.lengths.split(",")], [float(x) for x in args.ratios.split(",")], 5
    if args.tiny:
        templates, lengths, ratios, n_trials = templates[:1], [256], [0.2], 2
        recalls = [Recall.parse("recall-16-b8"), Recall.parse("recall-16-b8-shared-last")]
    out = args.out or os.path.join(le.REPO, "bench", "results", f"quality_long_asked_{args.split}.json")

    t0 = time.time()
    units = [(t, lengths, ratios, recalls, args.select, args.cli, n_trials) for t in templates]
    le.model()  # loaded once, before the workers fork
    if args.jobs > 1 and len(units) > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            results = pool.map(run_template, units, chunksize=1)
    else:
        results = [run_template(u) for u in units]
    recs, info = [], {}
    for t, (r, entry, log) in zip(templates, results):
        print("\n".join(line for line in log if " at ~" in line or "skipped" in line), flush=True)
        recs += r
        info[t["name"]] = entry
    header = {"how": " ".join(["bench/quality/asked_eval.py"] + list(argv or sys.argv[1:])),
              "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "git": le.git_revision(), "model": le.MODEL, "rule": RULE_FILE,
              "passkey_split_file": "bench/quality/passkey_split.json", "split": args.split,
              "templates": [t["name"] for t in templates], "lengths": lengths, "keep_ratios": ratios,
              "trials": n_trials, "answer_tokens": le.PASSKEY_ANSWER_TOKENS,
              "rows": [{"label": l, "policy": p, "options": o} for l, p, o in compressed_rows()]
              + [{"label": "kvzip", "prompt": REPEAT_PROMPT}] + [rc.__dict__ for rc in recalls],
              "default_options": le.DEFAULT, "paper_options": le.PAPER,
              "templates_run": info, "seconds": round(time.time() - t0, 1)}
    le.write_json(out, header, recs)
    print(f"asked_eval: wrote {out} ({len(recs)} records, {header['seconds']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
