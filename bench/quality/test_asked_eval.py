#!/usr/bin/env python3
"""Checks of the asked-later harness (bench/quality/asked_eval.py), not of its numbers:

* a ragged cache (heads holding different numbers of tokens, smollm2's KVCache.ragged):
  its masked slots change nothing, whatever token they point at, and a ragged cache whose
  heads all hold the same tokens equals the gathered one; greedy_many reads it alike;
* redoing only the question's last token equals redoing all of it when nothing came back;
* the KVzip-style score against a naive double-precision loop, on odd sizes;
* the protected selection: sink, newest window, then the highest scores, exactly B;
* a --tiny run end to end through select_configs and `flashcache recall`.

    test_asked_eval.py [SELECT_CONFIGS FLASHCACHE_CLI]

Exits 77 (ctest's SKIP_RETURN_CODE) when numpy, gguf, regex or the model package is missing.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile

import _paths  # noqa: F401  (tools/ on sys.path: the smollm2 package)

SKIP = 77


def naive_kvzip(q, k_ctx, k_rep, group):
    import numpy as np
    layers, hq, r, d = q.shape
    out = []
    for l in range(layers):
        hkv, p, _ = k_ctx[l].shape
        layer = np.zeros((hkv, p))
        for qh in range(hq):
            h = qh // group
            for i in range(r):
                keys = [k_ctx[l][h, j] for j in range(p)] + [k_rep[l, h, j] for j in range(i + 1)]
                s = np.array([float(np.dot(q[l, qh, i].astype(np.float64), key.astype(np.float64))) for key in keys])
                w = np.exp((s - s.max()) / np.sqrt(d))
                w /= w.sum()
                layer[h] = np.maximum(layer[h], w[:p])
        out.append(layer)
    return out


def check_pure(ae, np) -> None:
    rng = np.random.default_rng(5)
    layers, hkv, group, p, r, d = 2, 3, 2, 23, 9, 6
    q = rng.standard_normal((layers, hkv * group, r, d)).astype(np.float32)
    k_ctx = [rng.standard_normal((hkv, p, d)).astype(np.float32) for _ in range(layers)]
    k_rep = rng.standard_normal((layers, hkv, r, d)).astype(np.float32)
    got, want = ae.kvzip_scores(q, k_ctx, k_rep, group), naive_kvzip(q, k_ctx, k_rep, group)
    for g, w in zip(got, want):
        assert np.allclose(g, w, rtol=1e-4, atol=1e-7), "kvzip_scores differ from the naive loop"

    scores = rng.random((2, 40)).astype(np.float32)
    keep = ae.protected_top(scores, 13)          # sink 4, window round(6.5) = 7, 2 by score
    assert keep.shape == (2, 13)
    for h in range(2):
        assert list(keep[h][:4]) == [0, 1, 2, 3] and list(keep[h][-7:]) == list(range(33, 40))
        assert sorted(keep[h][4:6]) == sorted(4 + np.argsort(-scores[h, 4:33])[:2])
        assert np.all(np.diff(keep[h]) > 0)

    rc = ae.Recall.parse("recall-64-b32-shared-last")
    assert (rc.budget, rc.block, rc.shared, rc.redo_last, rc.digest) == (64, 32, True, True, False)
    assert len(ae.study_recalls()) == 36


def check_model(ae, le, np) -> None:
    m = le.model()
    ids = m.tokenizer.encode("The lighthouse keeper counted the ships that passed in the night. " * 5)
    pre = m.forward(ids, capture=True, all_logits=False)
    n, q_ids = len(ids), m.tokenizer.encode(" How many ships?")
    rng = np.random.default_rng(1)
    # Every head its own number of tokens.
    keep = [[np.sort(rng.permutation(n)[:8 + 3 * h + l % 2]) for h in range(m.n_kv_heads)] for l in range(m.n_layers)]
    ragged = pre.cache.ragged(keep)
    a = m.forward(q_ids, ragged, all_logits=False).logits[-1]
    moved = pre.cache.ragged(keep)
    for l in range(m.n_layers):   # the masked slots point elsewhere: nothing may change
        for h in range(m.n_kv_heads):
            width = len(keep[l][h])
            moved.k[l][h, width:] = 9.0
            moved.v[l][h, width:] = -9.0
    b = m.forward(q_ids, moved, all_logits=False).logits[-1]
    assert np.allclose(a, b, atol=1e-4), "a ragged cache's masked slots change the logits"
    unmasked = pre.cache.ragged(keep)
    unmasked.bias = None
    c = m.forward(q_ids, unmasked, all_logits=False).logits[-1]
    assert not np.allclose(a, c, atol=1e-4), "the mask changes nothing: the test cannot fail"
    same = [np.sort(rng.permutation(n)[:10]) for _ in range(m.n_layers)]
    gathered = pre.cache.gather([np.stack([s] * m.n_kv_heads) for s in same])
    as_ragged = pre.cache.ragged([[s] * m.n_kv_heads for s in same])
    assert np.allclose(m.forward(q_ids, gathered, all_logits=False).logits[-1],
                       m.forward(q_ids, as_ragged, all_logits=False).logits[-1], atol=1e-4)

    # greedy_many over a ragged cache equals it over the cache with its masked slots moved.
    qa, qb = m.forward(q_ids, ragged, all_logits=False), m.forward(q_ids, moved, all_logits=False)
    outs = le.greedy_many(m, [qa.cache, qb.cache], [qa.logits[-1], qb.logits[-1]], 6)
    assert outs[0] == outs[1], "greedy_many reads a ragged cache's masked slots"

    # Redo the last token only, nothing recalled: the same as decoding the question again.
    small = pre.cache.gather([np.stack([s] * m.n_kv_heads) for s in same])
    qf = m.forward(q_ids, small, capture=True, all_logits=False)
    whole = ae.question_again(m, small, q_ids, qf, redo_last=False)
    last = ae.question_again(m, small, q_ids, qf, redo_last=True)
    assert np.allclose(whole.logits[-1], last.logits[-1], atol=1e-3)
    assert whole.cache.next_position == last.cache.next_position == n + len(q_ids)


def tiny(ae, select_bin, cli) -> dict:
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "tiny.json")
        assert ae.main(["--tiny", "--select", select_bin, "--cli", cli, "--out", out, "--jobs", "1"]) == 0
        with open(out, encoding="utf-8") as f:
            doc = json.load(f)
    labels = {(r["label"], r["metric"]) for r in doc["records"]}
    for label in ("full", "defaults", "paper", "query-tail", "snapkv", "h2o", "kvzip", "recall-16-b8",
                  "recall-16-b8-shared-last"):
        assert (label, "passkey_hits") in labels, f"no passkey_hits for {label}"
    for r in doc["records"]:
        if r["metric"] == "needle_kept_share" and r["label"].startswith("recall-"):
            base = next(x for x in doc["records"] if x["metric"] == "needle_kept_share" and x["label"] == "defaults")
            assert r["value"] >= base["value"], "a recall row holds less of the needle than the defaults"
    return doc


def main(argv) -> int:
    for module in ("numpy", "gguf", "regex"):
        if importlib.util.find_spec(module) is None:
            print(f"SKIP: {module} is not installed")
            return SKIP
    import asked_eval as ae
    import long_eval as le
    import numpy as np
    checks = [("kvzip score, protected selection, row labels", lambda: check_pure(ae, np))]
    try:
        le.model()
    except Exception as e:  # the model package is missing
        print(f"SKIP: model unavailable ({e})")
        return SKIP
    checks.append(("ragged caches and the last-token redo", lambda: check_model(ae, le, np)))
    if len(argv) == 3:
        checks.append(("--tiny run", lambda: tiny(ae, argv[1], argv[2])))
    for name, check in checks:
        try:
            check()
        except AssertionError as e:
            print(f"FAIL {name}: {e}")
            return 1
        print(f"ok   {name}")
    print(f"{len(checks)} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
