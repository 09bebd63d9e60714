#!/usr/bin/env python3
"""Checks of the long-context harness (bench/quality/long_eval.py), not of its numbers:

* the attention error against a direct double-precision loop, on odd sizes;
* batched greedy decoding (greedy_many) against smollm2's one-cache decoder;
* select_configs with long_eval's DEFAULT against the CLI's defaults (no model), where the default's
  distance from the mean is off, ramps and is in full;
* a --tiny run end to end through select_configs and the CLI (one text, a 256-token prompt),
  of the table and of the passkey part (one template);
* the passkey set (passkey_split.json, tokenizer only, no forward pass): every prompt holds
  each of its keys exactly once and lands within 10% of the target length, the needle token
  positions are the key's tokens, the two-key hit rule, both splits for every filler kind.

    test_long_eval.py SELECT_CONFIGS FLASHCACHE_CLI
    python3 -m pytest bench/quality/test_long_eval.py -q      # the test_* functions

Set LONG_EVAL_SELECT and LONG_EVAL_CLI for pytest to run the --tiny runs too.

Exits 77 (ctest's SKIP_RETURN_CODE) when numpy, gguf, regex or the model package is missing.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import _paths  # noqa: F401  (tools/ on sys.path: the smollm2 package)

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


def _skip_without_model():
    """The module and its model, or pytest.skip / None when they are missing."""
    for module in ("numpy", "gguf", "regex"):
        if importlib.util.find_spec(module) is None:
            return None, f"{module} is not installed"
    import long_eval
    try:
        long_eval.model()
    except Exception as e:  # the model package is missing
        return None, f"model unavailable ({e})"
    return long_eval, None


def _need(what):
    mod, why = _skip_without_model()
    if mod is None:
        import pytest
        pytest.skip(why)
    return mod


def test_passkey_split_file():
    """Both splits for every filler kind, no template in both, 5 trials at 0.1-0.9 (multi-turn: 0.05-0.25),
    distinct keys."""
    with open(os.path.join(HERE, "passkey_split.json"), encoding="utf-8") as f:
        doc = json.load(f)
    templates = doc["templates"]
    assert "dev only" in doc["rule"] or "dev templates only" in doc["rule"]
    names = [t["name"] for t in templates]
    assert len(set(names)) == len(names)
    kinds = {t["kind"] for t in templates}
    assert {"short-sentences", "long-sentence", "paragraph", "list", "prose", "two-key"} <= kinds
    for kind in kinds:
        splits = [t["split"] for t in templates if t["kind"] == kind]
        assert sorted(set(splits)) == ["dev", "heldout"], (kind, splits)
        fillers = [json.dumps(t["filler"], sort_keys=True) for t in templates if t["kind"] == kind]
        assert len(set(fillers)) == len(fillers), f"{kind}: dev and held-out share a filler"
    assert {t["key_format"] for t in templates} == {"5-digit", "6-digit", "7-digit", "word"}
    all_keys = []
    for t in templates:
        assert t["split"] in ("dev", "heldout")
        assert len(t["trials"]) == 5
        # A multi-turn template gives its fact in an early turn; the others spread the key over the prompt.
        depths = [0.05, 0.1, 0.15, 0.2, 0.25] if t["kind"] == "multi_turn" else [0.1, 0.3, 0.5, 0.7, 0.9]
        assert [tr["depths"][tr["ask"]] for tr in t["trials"]] == depths, t["name"]
        for tr in t["trials"]:
            assert len(tr["keys"]) == len(tr["depths"]) == len(t["needles"]) == len(t["questions"])
            assert len(set(tr["keys"])) == len(tr["keys"])
            for k in tr["keys"]:
                if t["key_format"] == "word":
                    assert k.isalpha()
                else:
                    assert k.isdigit() and len(k) == int(t["key_format"][0])
            all_keys += tr["keys"]
        if t["filler"]["type"] == "text":
            assert t["filler"]["package"] and t["filler"]["path"].startswith("/usr/share/")
    assert len(set(all_keys)) == len(all_keys), "a key is used twice"
    with open(os.path.join(HERE, "long_split.json"), encoding="utf-8") as f:
        long_paths = {t["path"] for t in json.load(f)["texts"]}
    assert not long_paths & {t["filler"].get("path") for t in templates}


def test_passkey_hit_rule():
    from long_eval import passkey_hit
    assert passkey_hit(" 58213.", ["58213"], 0, False)
    assert not passkey_hit(" 5821", ["58213"], 0, False)
    assert passkey_hit(" Marmalade.", ["marmalade"], 0, True)
    assert not passkey_hit(" Marmalade.", ["marmalade"], 0, False)
    keys = ["31746", "85203"]
    assert passkey_hit(" 31746. The", keys, 0, False)
    assert not passkey_hit(" 31746 and 85203", keys, 0, False)   # both keys: no hit
    assert not passkey_hit(" 85203.", keys, 0, False)            # the other key
    assert passkey_hit(" 85203.", keys, 1, False)


def _longest_unit(le, tok, filler) -> int:
    """Tokens of a text filler's longest unit (0 for the others): a prompt stops a unit short of its target."""
    if filler["type"] != "text":
        return 0
    unit = filler.get("unit", "{text}\n\n")
    return max(len(tok.encode(unit.replace("{text}", p))) for p in le.read_text(filler).split("\n\n") if p.strip())


def test_passkey_prompts():
    """Each key exactly once, at most 10% over the target and short of it by at most 10% or one filler unit,
    needle positions = the key's tokens."""
    le = _need("model")
    tok = le.model().tokenizer
    for t in le.load_passkey_split()["templates"]:
        slack = _longest_unit(le, tok, t["filler"])
        for target in le.PASSKEY_LENGTHS:
            for tr in t["trials"]:
                text, spans = le.passkey_prompt(tok, t, tr, target)
                ids = tok.encode(text)
                assert len(ids) <= 1.1 * target, (t["name"], target, len(ids))
                assert target - len(ids) <= max(0.1 * target, slack), (t["name"], target, len(ids), slack)
                assert text.endswith(t["questions"][tr["ask"]])
                for key, span in zip(tr["keys"], spans):
                    assert text.count(key) == 1, (t["name"], key)
                    assert text[span[0]:span[1]] == key
                    pos = le.token_positions(tok, ids, text, span)
                    assert pos == list(range(pos[0], pos[-1] + 1))
                    assert tok.decode([ids[i] for i in pos]).strip() == key, (t["name"], key)
                order = sorted(range(len(spans)), key=lambda j: spans[j][0])   # needles in depth order
                assert order == sorted(range(len(spans)), key=lambda j: tr["depths"][j])


def test_kept_share():
    np = __import__("numpy")
    from long_eval import kept_share
    keep = [np.array([[0, 1, 5], [2, 3, 4]]), np.array([[1, 2, 3], [0, 1, 2]])]
    # positions 1, 2: head shares 1/2, 1/2, 1, 1
    assert abs(kept_share(keep, [1, 2]) - 0.75) < 1e-12


def _tiny_passkey(long_eval, select_bin, cli):
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "tiny_passkey.json")
        code = long_eval.main(["passkey", "--tiny", "--select", select_bin, "--cli", cli, "--out", out])
        with open(out, encoding="utf-8") as f:
            doc = json.load(f)
    assert code == 0
    info = doc["header"]["passkey"]["templates"]
    assert len(info) == 1 and doc["header"]["passkey_split"] == "dev"
    (name, entry), = info.items()
    assert entry["full_cache_hits"].keys() == {"256"}
    if entry["length"] is None:   # reported, skipped
        assert entry["skipped"] and not doc["records"]
        return doc
    got = {(r["label"], r["metric"]) for r in doc["records"]}
    for label in ("flashcache-default", "flashcache-paper", "knorm", "snapkv"):
        for metric in ("passkey_hits", "needle_kept_share"):
            assert (label, metric) in got, (label, metric)
    assert all(r["split"] == "dev" and r["template"] == name for r in doc["records"])
    return doc


def test_tiny_runs():
    select_bin, cli = os.environ.get("LONG_EVAL_SELECT"), os.environ.get("LONG_EVAL_CLI")
    if not (select_bin and cli):
        import pytest
        pytest.skip("LONG_EVAL_SELECT / LONG_EVAL_CLI not set")
    _tiny_passkey(_need("model"), select_bin, cli)


def select_equals_the_cli(select_bin: str, cli: str) -> str | None:
    """select_configs with long_eval's DEFAULT keeps what `flashcache compress` keeps with the library's defaults
    at the same keep ratio, where the distance from the mean is off (keep 0.1875), ramps (0.375) and is in
    full (0.625): both resolve the fading weight from the budget. The same with a bridge of 2 (`--bridge 2`),
    which select_configs applies to scores it mixed itself, and with the other distance (`--mean-distance
    kv_squared`; the default is KeyDiff's key_cosine). None, or what differs."""
    import long_eval
    import numpy as np

    layers, heads, p, d = 2, 2, 64, 8
    rng = np.random.default_rng(11)
    with tempfile.TemporaryDirectory(prefix="select_fade_") as work:
        for name in ("k", "v"):
            x = rng.standard_normal((layers, heads, p, d)).astype(np.float32)
            x[:, :, 20:23] += 4.0  # a short run unlike the rest: the residual and the distance rank it apart
            np.save(os.path.join(work, f"{name}.npy"), x)
        per_heads = (12, 24, 40)
        kept_sets = {}
        variants = {"defaults": ({}, []), "bridge 2": ({"bridge": 2}, ["--bridge", "2"]),
                    "kv_squared": ({"mean_distance": "kv_squared"}, ["--mean-distance", "kv_squared"])}
        for name, (change, flags) in variants.items():
            kept = long_eval.select(select_bin, work, [{"id": str(ph), "policy": "flashcache", "per_head": ph,
                                                        "options": dict(long_eval.DEFAULT, **change)}
                                                       for ph in per_heads])
            for ph in per_heads:
                out = os.path.join(work, f"cli_{name.replace(' ', '_')}_{ph}")
                run = subprocess.run([cli, "compress", "--k", os.path.join(work, "k.npy"), "--v",
                                      os.path.join(work, "v.npy"), "--keep-ratio", f"{ph / p}", *flags,
                                      "--out", out], capture_output=True, text=True)
                if run.returncode != 0:
                    return f"flashcache compress failed: {run.stderr.strip()}"
                want = [np.load(os.path.join(out, f"kept_{layer}.npy")) for layer in range(layers)]
                got, budgets = kept[str(ph)]
                if budgets != [w.shape[1] for w in want]:
                    return f"{name}, keep {ph}/{p}: budgets {budgets} against the CLI's " \
                           f"{[w.shape[1] for w in want]}"
                if not all(np.array_equal(g, w) for g, w in zip(got, want)):
                    return f"{name}, keep {ph}/{p}: select_configs kept other tokens than the CLI"
                kept_sets[name, ph] = got
        for name in ("bridge 2", "kv_squared"):  # each variant keeps other tokens somewhere, or it tested nothing
            if all(all(np.array_equal(a, b) for a, b in zip(kept_sets[name, ph], kept_sets["defaults", ph]))
                   for ph in per_heads):
                return f"{name} kept the defaults' tokens at every keep ratio: the comparison tests nothing"
    return None


def main(argv) -> int:
    for module in ("numpy", "gguf", "regex"):
        if importlib.util.find_spec(module) is None:
            print(f"SKIP: {module} is not installed")
            return SKIP
    import long_eval
    import numpy as np

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
    if len(argv) == 3:
        problem = select_equals_the_cli(argv[1], argv[2])
        if problem:
            print(f"FAIL select_configs against the CLI: {problem}")
            return 1
        print("ok   select_configs keeps what the CLI keeps with the defaults, a bridge of 2 and key_cosine, at keep "
              "0.1875, 0.375 and 0.625")

    try:
        model = long_eval.model()
    except Exception as e:  # the model package is missing
        print(f"SKIP: model unavailable ({e})")
        return SKIP
    from smollm2 import greedy_decode
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
        try:
            doc = _tiny_passkey(long_eval, argv[1], argv[2])
        except AssertionError as e:
            print(f"FAIL passkey --tiny: {e}")
            return 1
        print(f"ok   passkey --tiny run: {len(doc['records'])} records, "
              f"{doc['header']['passkey']['templates']}")
    for test in (test_passkey_split_file, test_passkey_hit_rule, test_passkey_prompts, test_kept_share):
        try:
            test()
        except AssertionError as e:
            print(f"FAIL {test.__name__}: {e}")
            return 1
        print(f"ok   {test.__name__}")
    print("7 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
