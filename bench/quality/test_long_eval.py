#!/usr/bin/env python3
"""Checks of the long-context harness (bench/quality/long_eval.py), not of its numbers:

* the attention error against a direct double-precision loop, on odd sizes;
* batched greedy decoding (greedy_many) against extract_llm's one-cache decoder;
* a --tiny run end to end through select_configs and the CLI (one text, a 256-token prompt).

    test_long_eval.py SELECT_CONFIGS FLASHCACHE_CLI

Exits 77 (ctest's SKIP_RETURN_CODE) when numpy, gguf, regex or the model package is missing.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = 77


def naive_error(q, k, v, p, group, keep):
    """Per layer, the relative error of attention_error.hpp, with plain loops in double."""
    import numpy as np
    layers, hkv, n, d = k.shape
    scale = 1.0 / np.sqrt(d)
    out = []
    for l in range(layers):
        diff = ref = 0.0
        for qh in range(hkv * group):
            h = qh // group
            for i in range(p, n):
                full = list(range(i + 1))
                small = [int(j) for j in keep[l][h]] + list(range(p, i + 1))
                outs = []
                for keys in (full, small):
                    s = np.array([float(np.dot(q[l, qh, i].astype(np.float64), k[l, h, j].astype(np.float64)))
                                  * scale for j in keys])
                    w = np.exp(s - s.max())
                    w /= w.sum()
                    outs.append(sum(w[a] * v[l, h, j].astype(np.float64) for a, j in enumerate(keys)))
                diff += float(np.sum((outs[1] - outs[0]) ** 2))
                ref += float(np.sum(outs[0] ** 2))
        out.append(np.sqrt(diff / ref))
    return out


def main(argv) -> int:
    for module in ("numpy", "gguf", "regex"):
        if importlib.util.find_spec(module) is None:
            print(f"SKIP: {module} is not installed")
            return SKIP
    import numpy as np
    sys.path.insert(0, HERE)
    import long_eval

    rng = np.random.default_rng(3)
    layers, hkv, group, n, d, p = 2, 3, 2, 29, 6, 21
    q = rng.standard_normal((layers, hkv * group, n, d)).astype(np.float32)
    k = rng.standard_normal((layers, hkv, n, d)).astype(np.float32)
    v = rng.standard_normal((layers, hkv, n, d)).astype(np.float32)
    keep = [np.sort(rng.permutation(p)[:b].reshape(1, -1).repeat(hkv, 0), axis=1) for b in (5, 13)]
    keep[1][2] = np.sort(rng.permutation(p)[:13])  # heads keep different tokens
    full = long_eval.full_attention(q, k, v, p, group)
    got = long_eval.attention_errors(q, k, v, p, group, keep, full)
    want = naive_error(q, k, v, p, group, keep)
    if not np.allclose(got, want, rtol=1e-4, atol=1e-6):
        print(f"FAIL attention error: {got} vs naive {want}")
        return 1
    print(f"ok   attention error vs naive loops: {got}")

    try:
        model = long_eval.model()
    except Exception as e:  # the model package is missing
        print(f"SKIP: model unavailable ({e})")
        return SKIP
    from extract_llm import greedy_decode
    ids = model.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 6)
    pre = model.forward(ids, all_logits=False)
    want, _ = greedy_decode(model, pre.cache, pre.logits[-1], 12, stop_at_eos=False)
    small = pre.cache.gather([np.arange(0, len(ids), 2)] * model.n_layers)
    want_small, _ = greedy_decode(model, small, pre.logits[-1], 12, stop_at_eos=False)
    got = long_eval.greedy_many(model, [pre.cache, small], pre.logits[-1], 12)
    if got != [want, want_small]:
        print(f"FAIL greedy_many {got} vs greedy_decode {[want, want_small]}")
        return 1
    print("ok   greedy_many equals greedy_decode on a full and a compressed cache")

    if len(argv) == 3:
        with tempfile.TemporaryDirectory() as work:
            out = os.path.join(work, "tiny.json")
            code = long_eval.main(["table", "--tiny", "--select", argv[1], "--cli", argv[2], "--out", out,
                                   "--jobs", "1"])
            with open(out, encoding="utf-8") as f:
                doc = json.load(f)
        metrics = {(r["label"], r["metric"]) for r in doc["records"]}
        for label in ("flashcache-default", "flashcache-paper", "knorm", "snapkv"):
            for metric in ("nll_ratio", "attn_rel_err", "greedy_match"):
                if (label, metric) not in metrics:
                    print(f"FAIL --tiny: no {metric} for {label}")
                    return 1
        if code != 0:
            return code
        print(f"ok   --tiny run: {len(doc['records'])} records")
    print("3 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
