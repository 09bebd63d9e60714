#!/usr/bin/env python3
"""Long-context quality of a compressed KV cache: SmolLM2-135M-Instruct, all 30 layers,
prompts of 1,024 to 4,096 tokens of real text (bench/quality/long_split.json).

For every text, prompt length P, row (a policy with its options) and keep ratio r, the
prompt's cache is compressed by the library (``select_configs``, which runs the policies,
select and allocation stages a user calls) and the model continues on top of it:

* ``nll_ratio``: teacher-forced NLL of the true next ``--continuation`` tokens over the
  full cache's (the first continuation token is predicted by the prefill, as after a real
  compression; the rest read the compressed cache);
* ``greedy_match``: share of ``--greedy`` greedy tokens equal to the full cache's, and
  ``greedy_first_diff``, the first position where they differ (``--greedy`` if none);
* ``attn_rel_err``: relative error of the attention output of the continuation queries,
  per layer and mean, as ``quality_eval`` defines it (attention_error.hpp): each query
  attends causally to the kept prompt tokens plus the continuation tokens before it, K, V
  and Q from the uncompressed forward pass;
* ``passkey`` (part ``passkey``): retrieval of keys planted in filler, asked at the end, over
  the templates of bench/quality/passkey_split.json (``--split dev`` by default; held-out
  only once the choices are made): ``passkey_hits`` out of 5 and ``needle_kept_share``.

Every row keeps the same number of tokens: n = round(r * P) per KV head and layer, 30 n
in all (FlashCache's dynamic allocation re-splits 30 n over the layers), and every row
but the paper's exact algorithm has the same protected set (sink, recent window), so that
rows differ only in the score.

Parts: ``table`` (every text, the rows of ROWS; writes bench/results/quality_long.json),
``study`` (dev texts only, NLL and attention error of the variants of one study stage;
writes bench/results/quality_long_study.json), ``passkey``. ``--tiny`` is the CI check of
the harness (one text, one short length), not of the numbers.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one BLAS thread per worker: --jobs runs several

import argparse  # noqa: E402
import datetime  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Dict, List, Optional, Sequence, Tuple  # noqa: E402

import _paths  # noqa: E402,F401  (tools/ on sys.path: the smollm2 package)
import numpy as np  # noqa: E402
from smollm2 import KVCache, SmolLM2, log_softmax  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

SPLIT_FILE = os.path.join(HERE, "long_split.json")
MODEL = "SmolLM2-135M-Instruct (30 layers)"
LENGTHS = (1024, 2048, 4096)
KEEP_RATIOS = (0.05, 0.1, 0.2, 0.4)

# The library's default options and the paper's exact algorithm, as select_configs reads
# them (field names of flashcache::Options). DEFAULT must equal flashcache::Options{}:
# long_eval checks it against `flashcache compress`'s summary.json (check_defaults).
PAPER = {"gamma": 0.2, "base": "lowpass", "transform": "global", "sink": 0, "window": 0, "window_share": 0.0,
         "base_share": 0.0, "normalize_terms": False, "rope_theta": 0, "allocation": "dynamic", "mean_weight": 0.0,
         "mean_full_keep": 0.0, "mean_zero_keep": 0.0, "bridge": 0, "mean_distance": "kv_squared"}
# The base study's choice (bench/quality/study/RULE.md): the peak base, gamma 0.1, global; and
# RULER's (docs/DEFAULTS.md): the distance from the mean at weight 0.75 where half or more is kept,
# fading to none at a quarter (a fixed 0.75 lost dev passkeys here, study/MEAN_RULE.md; the fade
# leaves keep 0.25 and below to the residual alone, study/FADE_RULE.md).
DEFAULT = dict(PAPER, gamma=0.05, base="peak", sink=4, window_share=0.5, transform="global", block_size=64,
               mean_weight=0.75, mean_full_keep=0.5, mean_zero_keep=0.25, mean_distance="key_cosine")
# The same with keys de-rotated with the model's RoPE base (ScoreOptions::rope, which a default
# cannot know).
ROPE = dict(DEFAULT, rope_theta=100000.0, rope_layout="half")
# The previous defaults (before the base study): low-pass base over 64-token blocks.
LOWPASS = dict(PAPER, sink=4, window_share=0.5, transform="blocked", block_size=64)
# The protected set every row shares (the default's): sink and recent window.
PROTECTED_FIELDS = ("sink", "window", "window_share")


def protected(options: Dict) -> Dict:
    return {f: options[f] for f in PROTECTED_FIELDS}


def table_rows() -> List[Tuple[str, str, Dict]]:
    """(label, policy, options) of the main table."""
    prot = protected(DEFAULT)
    rows = [("flashcache-default", "flashcache", dict(DEFAULT)),
            # One keep-set per sequence, as llama.cpp's cells hold it (SharedKeepOptions{}).
            ("flashcache-seq", "flashcache", dict(DEFAULT, keep_set="per_sequence", combine="mean_normalized")),
            ("flashcache-rope", "flashcache", dict(ROPE)),
            ("flashcache-lowpass", "flashcache", dict(LOWPASS)),
            ("flashcache-paper", "flashcache", dict(PAPER)),
            # The query-informed preset, Options::with_query_tail() with its feed (the query study's choice).
            ("flashcache-query", "flashcache", dict(DEFAULT, query="tail"))]
    for policy in ("streaming", "knorm", "keydiff", "random", "snapkv", "h2o"):
        rows.append((policy, policy, dict(prot, allocation="uniform")))
    return rows


# ----------------------------------------------------------------------------------------
# Texts.
# ----------------------------------------------------------------------------------------

def load_split() -> List[Dict]:
    with open(SPLIT_FILE, encoding="utf-8") as f:
        return json.load(f)["texts"]


def read_text(entry: Dict) -> str:
    path = entry["path"]
    if not os.path.exists(path):
        raise SystemExit(f"long_eval: {path} is missing: install the Debian package {entry['package']} "
                         f"(apt-get install {entry['package']}; bench/quality/run_long.sh does it)")
    raw = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
    return raw.decode("utf-8")


# ----------------------------------------------------------------------------------------
# Batched greedy decoding over preallocated caches.
# ----------------------------------------------------------------------------------------

class GrowingCache:
    """A prompt cache with room for ``extra`` new tokens per layer (no copy per step)."""

    def __init__(self, cache: KVCache, extra: int):
        self.k, self.v, self.bias, self.n = [], [], [], []
        for l, (k, v) in enumerate(zip(cache.k, cache.v)):
            h, m, d = k.shape
            kb = np.empty((h, m + extra, d), np.float32)
            vb = np.empty((h, m + extra, d), np.float32)
            kb[:, :m], vb[:, :m] = k, v
            self.k.append(kb)
            self.v.append(vb)
            bias = np.zeros((h, 1, m + extra), np.float32)  # a ragged cache's masked slots: -inf
            if cache.bias is not None:
                bias[:, 0, :m] = cache.bias[l]
            self.bias.append(bias)
            self.n.append(m)
        self.position = cache.next_position


def greedy_many(model: SmolLM2, caches: Sequence[KVCache], first_logits,
                n_new: int) -> List[List[int]]:
    """Greedy tokens on top of every cache at once: one weight product per step for all.
    ``first_logits``: the logits of the first token, one vector for all caches or a list
    of one per cache. Every cache must be at the same ``next_position``."""
    grow = [GrowingCache(c, n_new) for c in caches]
    if len({g.position for g in grow}) > 1:
        raise ValueError("greedy_many: the caches are at different positions")
    firsts = first_logits if isinstance(first_logits, (list, tuple)) else [first_logits] * len(caches)
    b_n, hkv, d, g = len(caches), model.n_kv_heads, model.head_dim, model.group
    scale = np.float32(1.0 / np.sqrt(d))

    def attend(l, q, k, v):
        attn = np.empty((b_n, model.n_heads * d), np.float32)
        for b, c in enumerate(grow):
            n = c.n[l]
            c.k[l][:, n], c.v[l][:, n] = k[b, :, 0], v[b, :, 0]
            c.n[l] = n + 1
            keys, values = c.k[l][:, :n + 1], c.v[l][:, :n + 1]
            s = np.matmul(q[b].reshape(hkv, g, d) * scale, keys.transpose(0, 2, 1))   # [Hkv, g, n+1]
            s += c.bias[l][:, :, :n + 1]
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            attn[b] = (np.matmul(s, values) / s.sum(axis=-1, keepdims=True)).reshape(-1)
        return attn

    out = [[int(np.argmax(f))] for f in firsts]
    for step in range(1, n_new):
        logits = model.decode_step([o[-1] for o in out], grow[0].position + step - 1, attend)
        for b in range(b_n):
            out[b].append(int(np.argmax(logits[b])))
    return out


# ----------------------------------------------------------------------------------------
# Attention-output error of the continuation queries (attention_error.hpp's measure).
# ----------------------------------------------------------------------------------------

def _attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray, first_new: int,
            scale: float) -> np.ndarray:
    """q [g, C, d] (continuation queries), keys/values [M + C, d], the last C of which are
    the continuation: query i sees keys [0, first_new + i]. Returns [g, C, d] float64."""
    c = q.shape[1]
    s = np.matmul(q * np.float32(scale), keys.T).astype(np.float64)        # [g, C, M+C]
    s[:, :, first_new:] += np.triu(np.full((c, c), -np.inf), k=1)
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    return np.matmul(s / s.sum(axis=-1, keepdims=True), values.astype(np.float64))


def full_attention(q, k, v, p: int, group: int) -> List[np.ndarray]:
    """Per layer, [Hq, C, d] outputs of the continuation queries over the full cache."""
    scale = 1.0 / np.sqrt(k.shape[-1])
    outs = []
    for l in range(k.shape[0]):
        heads = [_attend(q[l, h * group:(h + 1) * group, p:], k[l, h], v[l, h], p, scale)
                 for h in range(k.shape[1])]
        outs.append(np.concatenate(heads))
    return outs


def attention_errors(q, k, v, p: int, group: int, keep: Sequence[np.ndarray],
                     full: Sequence[np.ndarray]) -> List[float]:
    """Per layer sqrt(sum ||o' - o||^2 / sum ||o||^2) over query heads and queries."""
    scale = 1.0 / np.sqrt(k.shape[-1])
    errs = []
    for l in range(k.shape[0]):
        diff = ref = 0.0
        for h in range(k.shape[1]):
            idx = np.concatenate([keep[l][h], np.arange(p, k.shape[2])])
            o = _attend(q[l, h * group:(h + 1) * group, p:], k[l, h, idx], v[l, h, idx],
                        len(keep[l][h]), scale)
            o_full = full[l][h * group:(h + 1) * group]
            diff += float(np.sum((o - o_full) ** 2))
            ref += float(np.sum(o_full ** 2))
        errs.append(float(np.sqrt(diff / ref)) if ref > 0 else 0.0)
    return errs


# ----------------------------------------------------------------------------------------
# One (text, prompt length) unit: prefill, select every configuration, measure.
# ----------------------------------------------------------------------------------------

_MODEL: Optional[SmolLM2] = None


def model() -> SmolLM2:
    global _MODEL
    if _MODEL is None:
        _MODEL = SmolLM2.load()
    return _MODEL


def per_head_budget(ratio: float, prompt_len: int) -> int:
    return int(np.floor(ratio * prompt_len + 0.5))  # round half away from zero, as the library


def select(select_bin: str, work: str, configs: List[Dict]) -> Dict[str, Tuple[List[np.ndarray], List[int]]]:
    """kept[l] [H, B_l] and budgets per configuration id, from select_configs."""
    path = os.path.join(work, "configs.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"configs": configs}, f)
    run = subprocess.run([select_bin, "--cache", work, "--configs", path, "--out", work],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"select_configs failed: {run.stderr.strip()}")
    with open(os.path.join(work, "result.json"), encoding="utf-8") as f:
        result = json.load(f)["configs"]
    heads = np.load(os.path.join(work, "k.npy"), mmap_mode="r").shape[1]  # the cache's KV heads
    out = {}
    for r in result:
        flat = np.load(os.path.join(work, f"kept_{r['id']}.npy"))
        keep, at = [], 0
        for b in r["budgets"]:
            keep.append(flat[at:at + heads * b].reshape(heads, b))
            at += heads * b
        out[r["id"]] = (keep, r["budgets"])
    return out


def configs_for(rows, ratios, p: int) -> Tuple[List[Dict], Dict[str, Tuple]]:
    """select_configs' configurations for every (row, keep ratio) at prompt length p, and
    id -> (label, policy, options, ratio)."""
    configs, meta = [], {}
    for label, policy, options in rows:
        for r in ratios:
            cid = str(len(configs))
            configs.append({"id": cid, "policy": policy, "per_head": per_head_budget(r, p),
                            "options": options, "seed": 0})
            meta[cid] = (label, policy, options, r)
    return configs, meta


def save_cache(work: str, cache: KVCache, q: Optional[np.ndarray]) -> None:
    """k.npy, v.npy [L, H, P, d] (and q.npy) for select_configs."""
    np.save(os.path.join(work, "k.npy"), np.ascontiguousarray(np.stack(cache.k)))
    np.save(os.path.join(work, "v.npy"), np.ascontiguousarray(np.stack(cache.v)))
    if q is not None:
        np.save(os.path.join(work, "q.npy"), np.ascontiguousarray(q))


def run_unit(args: Tuple) -> List[Dict]:
    (text, split, ids, p, n_cont, n_greedy, rows, ratios, tasks, select_bin, log_prefix) = args
    m = model()
    t0 = time.time()
    seq = ids[:p + n_cont]
    cont = seq[p:]
    fwd = m.forward(seq, capture=True, logits_from=p - 1)
    lp = log_softmax(fwd.logits[:-1])
    full_tok_nll = -lp[np.arange(n_cont), cont]
    full_nll = float(full_tok_nll.mean())
    first_logits = fwd.logits[0]
    prompt_cache = KVCache([k[:, :p] for k in fwd.cache.k], [v[:, :p] for v in fwd.cache.v], p)
    t_prefill = time.time() - t0

    configs, meta = configs_for(rows, ratios, p)
    with tempfile.TemporaryDirectory(prefix="long_eval_") as work:
        needs_q = any(policy in ("snapkv", "h2o") or options.get("query", "none") != "none"
                      for _, policy, options in rows)
        save_cache(work, prompt_cache, fwd.q[:, :, :p] if needs_q else None)
        t1 = time.time()
        kept = select(select_bin, work, configs)
        t_select = time.time() - t1

    base = {"part": "long", "model": MODEL, "text": text, "split": split, "prompt_tokens": p,
            "continuation_tokens": n_cont}
    recs = [dict(base, policy="full", label="full", options={}, keep_ratio=1.0, metric="nll",
                 value=full_nll)]
    t2 = time.time()
    k_all, v_all = np.stack(fwd.cache.k), np.stack(fwd.cache.v)
    full_out = full_attention(fwd.q, k_all, v_all, p, m.group) if "attn" in tasks else None
    for cid, (label, policy, options, r) in meta.items():
        keep, budgets = kept[cid]
        rec = dict(base, policy=policy, label=label, options=options, keep_ratio=r)
        small = prompt_cache.gather(keep)
        if "nll" in tasks:
            nll = -log_softmax(m.forward(cont[:-1], small).logits)[np.arange(n_cont - 1), cont[1:]]
            nll = float(np.concatenate([full_tok_nll[:1], nll]).mean())
            recs.append(dict(rec, metric="nll", value=nll))
            recs.append(dict(rec, metric="nll_ratio", value=nll / full_nll))
        if "attn" in tasks:
            errs = attention_errors(fwd.q, k_all, v_all, p, m.group, keep, full_out)
            recs.append(dict(rec, metric="attn_rel_err", value=float(np.mean(errs)),
                             detail={"per_layer": errs, "budgets": budgets}))
        meta[cid] = (label, policy, options, r, small)
    t_measure = time.time() - t2

    t3 = time.time()
    if "greedy" in tasks and n_greedy > 0:
        order = list(meta)
        outs = greedy_many(m, [prompt_cache] + [meta[c][4] for c in order], first_logits, n_greedy)
        ref = outs[0]
        for cid, out in zip(order, outs[1:]):
            label, policy, options, r, _ = meta[cid]
            same = [a == b for a, b in zip(out, ref)]
            first_diff = same.index(False) if False in same else len(ref)
            rec = dict(base, policy=policy, label=label, options=options, keep_ratio=r)
            recs.append(dict(rec, metric="greedy_match", value=float(np.mean(same))))
            recs.append(dict(rec, metric="greedy_first_diff", value=first_diff))
    print(f"{log_prefix}{text} P={p}: full NLL {full_nll:.3f}; prefill {t_prefill:.0f}s, select "
          f"{t_select:.0f}s, nll+attn {t_measure:.0f}s, greedy {time.time() - t3:.0f}s", flush=True)
    return recs


# ----------------------------------------------------------------------------------------
# Study stages (dev texts only).
# ----------------------------------------------------------------------------------------

def study_rows(stage: str, base: Dict) -> List[Tuple[str, str, Dict]]:
    """The variants of one study stage, each as (label, "flashcache", options)."""
    rows: List[Tuple[str, str, Dict]] = []
    if stage == "protect":
        for sink in (0, 1, 4):
            for share in (0.0, 0.125, 0.25, 0.5):
                rows.append((f"sink{sink}-win{share:g}", "flashcache",
                             dict(base, sink=sink, window_share=share)))
    elif stage == "score":
        rows.append(("base", "flashcache", dict(base)))
        for gamma in (0.1, 0.3):
            rows.append((f"gamma{gamma:g}", "flashcache", dict(base, gamma=gamma)))
        rows.append(("normalize", "flashcache", dict(base, normalize_terms=True)))
        rows.append(("derotate", "flashcache", dict(base, rope_theta=100000.0)))
        rows.append(("blocked", "flashcache", dict(base, transform="blocked")))
        rows.append(("uniform", "flashcache", dict(base, allocation="uniform")))
        for share in (0.25, 0.5):
            rows.append((f"base{share:g}", "flashcache", dict(base, base_share=share)))
        prot = protected(base)
        for policy in ("knorm", "keydiff", "snapkv"):
            rows.append((policy, policy, dict(prot, allocation="uniform")))
    elif stage == "combine":
        # The stage-2 changes that beat its base by more than the tie margin (gamma 0.1,
        # blocked, de-rotated keys), together. De-rotation needs the model's RoPE base, which
        # Options{} cannot know: its rows say what a caller gains by setting ScoreOptions::rope.
        for rope in (0.0, 100000.0):
            for gamma in (0.2, 0.1):
                for transform in ("global", "blocked"):
                    label = (f"gamma{gamma:g}-{transform}" + ("-derotate" if rope else ""))
                    rows.append((label, "flashcache",
                                 dict(base, gamma=gamma, transform=transform, rope_theta=rope)))
    else:
        raise SystemExit(f"long_eval: unknown study stage {stage!r} (protect, score, combine)")
    return rows


# ----------------------------------------------------------------------------------------
# Passkey retrieval: the templates of passkey_split.json.
# ----------------------------------------------------------------------------------------

PASSKEY_SPLIT_FILE = os.path.join(HERE, "passkey_split.json")
PASSKEY_LENGTHS = (512, 1024, 2048)
PASSKEY_ANSWER_TOKENS = 8


def load_passkey_split() -> Dict:
    with open(PASSKEY_SPLIT_FILE, encoding="utf-8") as f:
        return json.load(f)


def passkey_units(tok, filler: Dict, budget: int) -> List[str]:
    """The filler's units (a repeated text, list lines, a file's paragraphs) whose tokens
    add up to at most ``budget`` (at least one unit)."""
    kind = filler["type"]
    if kind == "repeat":
        return [filler["text"]] * max(1, budget // len(tok.encode(filler["text"])))
    if kind == "list":
        (a0, a1, a2), (b0, b1, b2) = filler["a"], filler["b"]
        source = (filler["line"].format(n=i + 1, a=a0 + (i * a1) % a2, b=b0 + (i * b1) % b2)
                  for i in range(1_000_000))
    elif kind == "text":
        text = read_text(filler)
        unit = filler.get("unit", "{text}\n\n")  # a turn of a conversation wraps each paragraph
        source = iter([unit.replace("{text}", p) for p in text.split("\n\n") if p.strip()])
    else:
        raise SystemExit(f"long_eval: unknown filler type {kind!r} in {PASSKEY_SPLIT_FILE}")
    units, used = [], 0
    for unit in source:
        n = len(tok.encode(unit))
        if units and used + n > budget:
            return units
        units.append(unit)
        used += n
    if kind == "text":
        raise SystemExit(f"long_eval: {filler['path']} has fewer than {budget} tokens of filler")
    return units


def passkey_prompt(tok, template: Dict, trial: Dict, target_tokens: int) -> Tuple[str, List[Tuple[int, int]]]:
    """The trial's prompt of about ``target_tokens`` tokens: intro, filler with each needle
    at its depth (between filler units), the asked key's question. Returns the text and the
    character span of every key (in the order of trial["keys"])."""
    needles = [n.format(key=k) for n, k in zip(template["needles"], trial["keys"])]
    question = template["questions"][trial["ask"]]
    fixed = len(tok.encode(template["intro"] + "".join(needles) + question))
    units = passkey_units(tok, template["filler"], target_tokens - fixed)
    at = [int(round(d * len(units))) for d in trial["depths"]]
    text, spans = template["intro"], [(0, 0)] * len(needles)
    for i in range(len(units) + 1):
        for j in sorted((j for j in range(len(needles)) if at[j] == i), key=lambda j: trial["depths"][j]):
            start = len(text) + needles[j].index(trial["keys"][j])
            spans[j] = (start, start + len(trial["keys"][j]))
            text += needles[j]
        if i < len(units):
            text += units[i]
    return text + question, spans


def token_positions(tok, ids: Sequence[int], text: str, span: Tuple[int, int]) -> List[int]:
    """Positions of the tokens of ``ids`` (the encoding of ``text``) that overlap the
    character span: the key's tokens."""
    lo, hi = len(text[:span[0]].encode("utf-8")), len(text[:span[1]].encode("utf-8"))
    out, at = [], 0
    for pos, i in enumerate(ids):
        tok_str = tok.tokens[int(i)]
        n = len(tok_str.encode("utf-8")) if tok_str in tok.special else len(tok_str)
        if at < hi and at + n > lo:
            out.append(pos)
        at += n
    if at != len(text.encode("utf-8")):
        raise RuntimeError("token_positions: the ids are not the encoding of the text")
    return out


def passkey_hit(answer: str, keys: Sequence[str], ask: int, word: bool) -> bool:
    """The asked key appears in the answer and no other key of the prompt does."""
    if word:
        answer, keys = answer.lower(), [k.lower() for k in keys]
    return keys[ask] in answer and not any(k in answer for j, k in enumerate(keys) if j != ask)


def kept_share(keep: Sequence[np.ndarray], positions: Sequence[int]) -> float:
    """Share of ``positions`` kept, averaged over layers and KV heads."""
    pos = np.asarray(positions)
    return float(np.mean([np.isin(pos, heads).mean() for layer in keep for heads in layer]))


def run_passkey(templates: Sequence[Dict], lengths: Sequence[int], rows, ratios, select_bin: str,
                log) -> Tuple[List[Dict], Dict]:
    """Per template: the full cache at every length (hits out of 5), the longest length with
    at least 4 chosen, then every row x keep ratio on the 5 trials at that length."""
    m = model()
    tok = m.tokenizer
    recs: List[Dict] = []
    info: Dict = {"templates": {}}
    for t in templates:
        word = t["key_format"] == "word"
        entry = {"split": t["split"], "kind": t["kind"], "key_format": t["key_format"],
                 "full_cache_hits": {}, "prompt_tokens": {}, "length": None, "seconds": {}}
        info["templates"][t["name"]] = entry
        chosen = None   # (length, [(ids, spans, prefill)] per trial)
        for target in sorted(lengths, reverse=True):
            t0 = time.time()
            hits, trials = 0, []
            for trial in t["trials"]:
                text, spans = passkey_prompt(tok, t, trial, target)
                ids = tok.encode(text)
                pre = m.forward(ids, capture=chosen is None, all_logits=False)
                out = greedy_many(m, [pre.cache], pre.logits[-1], PASSKEY_ANSWER_TOKENS)[0]
                hits += passkey_hit(tok.decode(out), trial["keys"], trial["ask"], word)
                trials.append((trial, text, ids, spans, pre if chosen is None else None))
            entry["full_cache_hits"][str(target)] = hits
            entry["prompt_tokens"][str(target)] = [len(x[2]) for x in trials]
            entry["seconds"][f"full_{target}"] = round(time.time() - t0, 1)
            log(f"[passkey] {t['name']} ({t['split']}): full cache at ~{target} tokens: {hits}/5")
            if chosen is None and hits >= 4:
                chosen = (target, trials)
        if chosen is None:
            entry["skipped"] = "the full cache finds fewer than 4 of 5 keys at every length"
            log(f"[passkey] {t['name']}: skipped (no length with 4 of 5)")
            continue
        target, trials = chosen
        entry["length"] = target
        t0 = time.time()
        hits: Dict[Tuple[str, float], int] = {}
        share: Dict[Tuple[str, float], List[float]] = {}
        full_hits = 0
        for trial, text, ids, spans, pre in trials:
            p = len(ids)
            needle = token_positions(tok, ids, text, spans[trial["ask"]])
            configs, meta = configs_for(rows, ratios, p)
            with tempfile.TemporaryDirectory(prefix="long_eval_pk_") as work:
                save_cache(work, pre.cache, pre.q)
                kept = select(select_bin, work, configs)
            order = list(meta)
            outs = greedy_many(m, [pre.cache] + [pre.cache.gather(kept[c][0]) for c in order], pre.logits[-1],
                               PASSKEY_ANSWER_TOKENS)
            full_hits += passkey_hit(tok.decode(outs[0]), trial["keys"], trial["ask"], word)
            for cid, out in zip(order, outs[1:]):
                label, _, _, r = meta[cid]
                hits[(label, r)] = hits.get((label, r), 0) + passkey_hit(tok.decode(out), trial["keys"],
                                                                         trial["ask"], word)
                share.setdefault((label, r), []).append(kept_share(kept[cid][0], needle))
        entry["seconds"]["rows"] = round(time.time() - t0, 1)
        base = {"part": "passkey", "model": MODEL, "split": t["split"], "template": t["name"], "kind": t["kind"],
                "key_format": t["key_format"], "prompt_tokens": target,
                "prompt_tokens_per_trial": [len(x[2]) for x in trials], "trials": len(trials)}
        recs.append(dict(base, policy="full", label="full", options={}, keep_ratio=1.0, metric="passkey_hits",
                         value=full_hits))
        for label, policy, options in rows:
            for r in ratios:
                rec = dict(base, policy=policy, label=label, options=options, keep_ratio=r)
                recs.append(dict(rec, metric="passkey_hits", value=hits[(label, r)]))
                recs.append(dict(rec, metric="needle_kept_share", value=float(np.mean(share[(label, r)]))))
        log(f"[passkey] {t['name']} at ~{target}: rows x ratios in {entry['seconds']['rows']:.0f}s; "
            + ", ".join(f"{l}@{r:g} {hits[(l, r)]}/5" for l, _, _ in rows for r in ratios))
    return recs, info


# ----------------------------------------------------------------------------------------
# Driver.
# ----------------------------------------------------------------------------------------

def load_rows(path: str) -> List[Tuple[str, str, Dict]]:
    """--rows: a JSON list of [label, policy, options]; options go to select_configs as they are."""
    with open(path, encoding="utf-8") as f:
        rows = json.load(f)
    if not isinstance(rows, list) or not rows or not all(
            isinstance(r, list) and len(r) == 3 and isinstance(r[0], str) and isinstance(r[1], str)
            and isinstance(r[2], dict) for r in rows):
        raise SystemExit(f"long_eval: {path} must be a JSON list of [label, policy, options] triples")
    labels = [r[0] for r in rows]
    if len(set(labels)) != len(labels):
        raise SystemExit(f"long_eval: {path} has repeated labels")
    return [(l, p, o) for l, p, o in rows]


def check_defaults(cli: str) -> None:
    """DEFAULT above must be flashcache::Options{}: compare with what the CLI records."""
    with tempfile.TemporaryDirectory(prefix="long_eval_defaults_") as work:
        k = np.random.default_rng(0).standard_normal((1, 1, 40, 4)).astype(np.float32)
        np.save(os.path.join(work, "k.npy"), k)
        np.save(os.path.join(work, "v.npy"), k)
        run = subprocess.run([cli, "compress", "--k", os.path.join(work, "k.npy"), "--v",
                              os.path.join(work, "v.npy"), "--out", os.path.join(work, "out")],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"long_eval: {cli} failed: {run.stderr.strip()}")
        with open(os.path.join(work, "out", "summary.json"), encoding="utf-8") as f:
            got = json.load(f)["options"]
    for field in ("gamma", "base", "transform", "block", "sink", "window", "window_share", "base_share", "normalize_terms",
                  "allocation", "mean_weight", "mean_full_keep", "mean_zero_keep", "bridge", "mean_distance"):
        want = DEFAULT["block_size" if field == "block" else field]
        if got[field] != want:
            raise SystemExit(f"long_eval: DEFAULT[{field!r}] = {want!r} but the library's default is "
                             f"{got[field]!r}")
    if got.get("query") != "none":  # DEFAULT reads no queries; so must Options{}
        raise SystemExit(f"long_eval: the library's default query input is {got.get('query')!r}, not 'none'")


def git_revision() -> Optional[str]:
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def write_json(path: str, header: Dict, records: List[Dict]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"header": header, "records": records}, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=["table", "study", "passkey"])
    ap.add_argument("--select", default=os.path.join(REPO, "build-quality-eval", "select_configs"),
                    help="the select_configs binary (bench/quality)")
    ap.add_argument("--cli", default=os.path.join(REPO, "build-quality-eval", "flashcache", "tools", "cli",
                                                  "flashcache"),
                    help="the flashcache CLI, to check DEFAULT against the library's defaults")
    ap.add_argument("--out", default=None, help="JSON output (default bench/results/quality_long*.json)")
    ap.add_argument("--split", choices=["dev", "heldout", "all"], default=None)
    ap.add_argument("--texts", default="", help="comma-separated text names (default: the split's)")
    ap.add_argument("--lengths", default=None,
                    help="prompt lengths (default 1024,2048,4096; passkey: 512,1024,2048, the longest where the "
                         "full cache finds 4 of 5 is used per template)")
    ap.add_argument("--ratios", default=",".join(map(str, KEEP_RATIOS)))
    ap.add_argument("--rows", default=None, metavar="FILE.json",
                    help="the rows instead of the built-in ones, a JSON list of [label, policy, "
                         "options] (options as select_configs reads them, passed through untouched)")
    ap.add_argument("--templates", default="", help="passkey: comma-separated template names (default: the split's)")
    ap.add_argument("--continuation", type=int, default=256)
    ap.add_argument("--greedy", type=int, default=64)
    ap.add_argument("--stage", default="protect", help="study stage: protect, score, combine")
    ap.add_argument("--base", default="{}", help="study: JSON options the stage starts from (over PAPER)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (one BLAS thread each)")
    ap.add_argument("--tiny", action="store_true", help="CI: one text, 256-token prompt, 4 rows")
    args = ap.parse_args(argv)

    texts = load_split()
    lengths = [int(x) for x in (args.lengths or ",".join(map(str, PASSKEY_LENGTHS if args.part == "passkey"
                                                               else LENGTHS))).split(",")]
    ratios = [float(x) for x in args.ratios.split(",")]
    n_cont, n_greedy = args.continuation, args.greedy
    split = args.split or ("dev" if args.part in ("study", "passkey") else "all")
    if args.part == "study" and split != "dev":
        raise SystemExit("long_eval: the study runs on dev texts only")
    if args.part == "table":
        check_defaults(args.cli)
        rows = table_rows()
        tasks = ("nll", "attn", "greedy")
        out = args.out or os.path.join(REPO, "bench", "results", "quality_long.json")
    elif args.part == "study":
        rows = study_rows(args.stage, dict(PAPER, **json.loads(args.base)))
        tasks = ("nll", "attn")
        out = args.out or os.path.join(REPO, "bench", "results", f"quality_long_study_{args.stage}.json")
    else:
        check_defaults(args.cli)
        rows = table_rows()
        out = args.out or os.path.join(REPO, "bench", "results", "quality_long_passkey.json")
    if args.rows:  # the table too: a held-out run of a study's rows
        rows = load_rows(args.rows)
    templates = [t for t in load_passkey_split()["templates"] if split == "all" or t["split"] == split]
    if args.templates:
        names = args.templates.split(",")
        unknown = set(names) - {t["name"] for t in load_passkey_split()["templates"]}
        if unknown:
            raise SystemExit(f"long_eval: unknown passkey templates {sorted(unknown)}")
        templates = [t for t in load_passkey_split()["templates"] if t["name"] in names]
    if args.tiny:
        texts, lengths, ratios = texts[:1], [256], [0.2]
        n_cont, n_greedy = 32, 8
        if not args.rows:
            rows = [r for r in rows if r[0] in ("flashcache-default", "flashcache-paper", "knorm", "snapkv")]
        templates = templates[:1]
    elif args.texts:
        names = args.texts.split(",")
        texts = [t for t in texts if t["name"] in names]
    elif split != "all":
        texts = [t for t in texts if t["split"] == split]

    t0 = time.time()
    header = {"how": " ".join(["bench/quality/long_eval.py"] + list(argv or sys.argv[1:])),
              "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "git": git_revision(), "model": MODEL, "split_file": "bench/quality/long_split.json",
              "split": {t["name"]: t["split"] for t in load_split()},
              "texts": {t["name"]: {"package": t["package"], "path": t["path"]} for t in texts},
              "lengths": lengths, "keep_ratios": ratios, "continuation_tokens": n_cont,
              "greedy_tokens": n_greedy, "default_options": DEFAULT, "rope_options": ROPE, "paper_options": PAPER,
              "rows": [{"label": l, "policy": p, "options": o} for l, p, o in rows],
              "budget_rule": "n = round(r * P) per KV head and layer, 30 n in all; dynamic allocation "
                             "re-splits 30 n over the layers"}
    if args.part == "passkey":
        pk = load_passkey_split()
        header.update({"passkey_split_file": "bench/quality/passkey_split.json", "passkey_rule": pk["rule"],
                       "passkey_split": split, "passkey_answer_tokens": PASSKEY_ANSWER_TOKENS,
                       "passkey_templates": [t["name"] for t in templates],
                       "passkey_template_splits": {t["name"]: t["split"] for t in pk["templates"]}})
        recs, info = run_passkey(templates, lengths, rows, ratios, args.select, lambda s: print(s, flush=True))
        header["passkey"] = info
    else:
        tok = model().tokenizer
        units = []
        for t in texts:
            ids = tok.encode(read_text(t))
            for p in lengths:
                if len(ids) < p + n_cont:
                    raise SystemExit(f"long_eval: {t['name']} has {len(ids)} tokens < {p} + {n_cont}")
                units.append((t["name"], t["split"], ids, p, n_cont, n_greedy, rows, ratios, tasks,
                              args.select, f"[{args.part}] "))
        units.sort(key=lambda u: -u[3])  # longest first: the pool ends evenly
        if args.jobs > 1 and len(units) > 1:
            with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
                recs = [r for part in pool.imap_unordered(run_unit, units) for r in part]
        else:
            recs = [r for u in units for r in run_unit(u)]
    header["seconds"] = round(time.time() - t0, 1)
    write_json(out, header, recs)
    print(f"long_eval: wrote {out} ({len(recs)} records, {header['seconds']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
