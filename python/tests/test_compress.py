"""score, compress and compress_model against the C++ CLI on the same input (bit for bit), in every dtype and layout."""

import json
import subprocess

import flashcache as fc
import numpy as np
import pytest
from conftest import random_kv


def run_cli(cli, tmp_path, k, v, *args):
    """The CLI's compress on [L, H, N, d] arrays: its kept indices, K', V' per layer and its summary."""
    np.save(tmp_path / "k.npy", k)
    np.save(tmp_path / "v.npy", v)
    out = tmp_path / "out"
    subprocess.run(
        [cli, "compress", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy", "--out", out, *args],
        check=True,
        capture_output=True,
    )
    layers = k.shape[0]
    kept = [np.load(out / f"kept_{layer}.npy") for layer in range(layers)]
    ks = [np.load(out / f"k_{layer}.npy") for layer in range(layers)]
    vs = [np.load(out / f"v_{layer}.npy") for layer in range(layers)]
    return kept, ks, vs, np.load(out / "budgets.npy"), json.loads((out / "summary.json").read_text())


CASES = {
    "defaults": ([], fc.Options()),
    "paper": (["--paper"], fc.Options.paper()),
    "blocked": (
        ["--transform", "blocked", "--block", "48"],
        fc.Options(score=fc.ScoreOptions(transform="blocked", block_size=48)),
    ),
    "uniform": (["--no-allocate"], fc.Options(allocate=fc.AllocateOptions(mode="uniform"))),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_compress_model_equals_the_cli(cli, tmp_path, rng, case, dtype):
    layers = [random_kv(rng, heads=3, tokens=157, dim=40, dtype=dtype) for _ in range(4)]
    for i, (k, _) in enumerate(layers):  # layers of different roughness, so that the allocation moves budget
        k[:, 1 :: (i + 2)] *= 3 + i
    k = np.stack([kv[0] for kv in layers])
    v = np.stack([kv[1] for kv in layers])
    args, options = CASES[case]
    kept, ks, vs, budgets, _ = run_cli(cli, tmp_path, k, v, "--keep-ratio", "0.3", *args)
    model = fc.compress_model(list(k), list(v), 0.3, options)
    np.testing.assert_array_equal(model.budgets, budgets)
    for layer in range(len(kept)):
        got = model.layers[layer]
        np.testing.assert_array_equal(got.kept, kept[layer])
        np.testing.assert_array_equal(got.k, ks[layer])
        np.testing.assert_array_equal(got.v, vs[layer])
        assert got.k.dtype == dtype


def test_compress_of_one_layer_equals_the_cli_per_head_count(cli, tmp_path, rng):
    k, v = random_kv(rng, heads=5, tokens=203, dim=24)
    kept, ks, _, _, _ = run_cli(cli, tmp_path, k[None], v[None], "--keep", "37")
    out = fc.compress(k, v, 37)
    np.testing.assert_array_equal(out.kept, kept[0])
    np.testing.assert_array_equal(out.k, ks[0])
    assert out.budget == 37


def test_query_tails_mixed_into_the_score_equal_the_cli(cli, tmp_path, rng):
    k, v = random_kv(rng, heads=2, tokens=300, dim=32)
    q = rng.standard_normal((4, 300, 32)).astype(np.float32)  # two query heads per KV head
    np.save(tmp_path / "q.npy", q[None])
    kept, _, _, _, summary = run_cli(cli, tmp_path, k[None], v[None], "--keep", "60", "--q", tmp_path / "q.npy")
    tails = fc.query_tails(q, k)
    out = fc.compress(k, v, 60, fc.Options.with_query_tail(), tails=tails)
    assert summary["options"]["query"] == "tail"
    np.testing.assert_array_equal(out.kept, kept[0])


def test_layouts_agree_and_nhd_is_read_in_place(rng):
    k, v = random_kv(rng)
    k_nhd, v_nhd = np.ascontiguousarray(k.transpose(1, 0, 2)), np.ascontiguousarray(v.transpose(1, 0, 2))
    a = fc.compress(k, v, 0.25)
    b = fc.compress(k_nhd, v_nhd, 0.25, layout="nhd")
    np.testing.assert_array_equal(a.kept, b.kept)
    np.testing.assert_array_equal(a.k, b.k)
    # A transposed view is the same memory: no copy is made on the way in.
    info = fc._core.view_info(k_nhd.transpose(1, 0, 2), fc._core.Layout.hnd)
    assert info == (k_nhd.ctypes.data, 3, 157, 40, 40, 120)
    c = fc.compress(k_nhd.transpose(1, 0, 2), v_nhd.transpose(1, 0, 2), 0.25)
    np.testing.assert_array_equal(a.kept, c.kept)


def test_a_slice_of_a_bigger_cache_is_read_in_place(rng):
    big = rng.standard_normal((2, 6, 400, 64)).astype(np.float32)  # [batch, heads, tokens, dim]
    view = big[1, :, 50:350]
    info = fc._core.view_info(view, fc._core.Layout.hnd)
    assert info[0] == view.ctypes.data and info[4:] == (400 * 64, 64)
    out = fc.compress(view, view, 0.2)
    ref = fc.compress(np.ascontiguousarray(view), np.ascontiguousarray(view), 0.2)
    np.testing.assert_array_equal(out.kept, ref.kept)


def test_score_is_what_compress_ranks(rng):
    k, v = random_kv(rng)
    s = fc.score(k, v, keep=0.3)  # the default distance from the mean follows the keep ratio
    out = fc.compress(k, v, 0.3)
    np.testing.assert_array_equal(s.score, out.scores)
    assert s.energy.shape == (3, 4) and s.energy_ratio == pytest.approx(out.energy_ratio)
    assert s.nonfinite == 0


def test_mean_weight_follows_the_keep_ratio(rng):
    """mean_full_keep / mean_zero_keep: the weight at a keep ratio scores as that fixed weight, bit for bit,
    through score(keep=), compress (a ratio or a count) and compress_model."""
    k, v = random_kv(rng, tokens=80)
    fade = fc.ScoreOptions(mean_weight=0.75, mean_full_keep=0.5, mean_zero_keep=0.25)
    assert fc.ScoreOptions() == fade  # the library's default
    # (0.375 - 0.25) / (0.5 - 0.25) * 0.75, at every keep ratio
    fixed = fc.ScoreOptions(mean_weight=0.375, mean_full_keep=0, mean_zero_keep=0)
    residual = fc.ScoreOptions(mean_weight=0)
    np.testing.assert_array_equal(fc.score(k, v, fade, keep=0.375).score, fc.score(k, v, fixed).score)
    np.testing.assert_array_equal(fc.score(k, v, fade, keep=0.2).score, fc.score(k, v, residual).score)
    assert not np.array_equal(fc.score(k, v, fixed).score, fc.score(k, v, residual).score)
    for keep in (0.375, 30):
        a = fc.compress(k, v, keep, fc.Options(score=fade))
        b = fc.compress(k, v, keep, fc.Options(score=fixed))
        np.testing.assert_array_equal(a.scores, b.scores)
        np.testing.assert_array_equal(a.kept, b.kept)
    ma = fc.compress_model([k, k], [v, v], 0.375, fc.Options(score=fade))
    mb = fc.compress_model([k, k], [v, v], 0.375, fc.Options(score=fixed))
    for a, b in zip(ma.layers, mb.layers):
        np.testing.assert_array_equal(a.kept, b.kept)
    with pytest.raises(ValueError, match="keep ratio 1.5 is outside"):
        fc.score(k, v, fade, keep=1.5)
    with pytest.raises(ValueError, match="mean_full_keep 0.1 is outside"):
        fc.score(k, v, fc.ScoreOptions(mean_full_keep=0.1, mean_zero_keep=0.2))


def test_masks_spans_and_nonfinite_rows(rng):
    k, v = random_kv(rng, tokens=120)
    mask = np.zeros(120, dtype=bool)
    mask[60:70] = True
    out = fc.compress(k, v, 30, mask=mask)
    for head in out.kept:
        assert set(range(60, 70)) <= set(head.tolist())
    k[1, 77, 3] = np.nan
    out = fc.compress(k, v, 30)
    assert out.nonfinite == 1 and 77 in out.kept[1]
    spans = fc.compress(k, v, 30, spans=[(16, 8, 8)])
    assert spans.kept.shape == (3, 30)


def test_shared_keep_sets(rng):
    layers = [random_kv(rng, tokens=128) for _ in range(3)]
    model = fc.compress_model(
        [x[0] for x in layers], [x[1] for x in layers], 0.25, shared=fc.SharedKeepOptions(keep_set="per_sequence")
    )
    for layer in model.layers:
        assert (layer.kept == model.layers[0].kept[0]).all()


def test_layers_scored_on_several_threads_give_the_same_model(rng):
    layers = [random_kv(rng, heads=2, tokens=211, dim=24) for _ in range(5)]
    ks, vs = [k for k, _ in layers], [v for _, v in layers]
    one = fc.compress_model(ks, vs, 0.3, threads=1)
    for threads in (2, 3, 8):
        many = fc.compress_model(ks, vs, 0.3, threads=threads)
        np.testing.assert_array_equal(many.budgets, one.budgets)
        for a, b in zip(many.layers, one.layers):
            np.testing.assert_array_equal(a.kept, b.kept)
            np.testing.assert_array_equal(a.scores, b.scores)
    with pytest.raises(ValueError, match="threads 0 must be at least 1"):
        fc.compress_model(ks, vs, 0.3, threads=0)
