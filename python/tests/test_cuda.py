"""The door for CUDA tensors (flashcache.cuda): built or refused by name, and on a device the same
choices as the CPU. Without a device its runs skip by name; without torch the whole file does."""

import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the CUDA door tests skip")

import flashcache as fc  # noqa: E402
import flashcache.cuda as fcc  # noqa: E402
from conftest import random_kv  # noqa: E402

needs_door = pytest.mark.skipif(not fc.has_cuda, reason="this build has no CUDA door (FLASHCACHE_PYTHON_CUDA)")
needs_device = pytest.mark.skipif(not fcc.available(), reason="no CUDA device: the GPU door's runs skip")


def test_has_cuda_says_whether_the_door_is_built_without_loading_it():
    assert fc.has_cuda == (importlib.util.find_spec("flashcache._cuda") is not None)
    assert isinstance(fcc.device_count(), int) and fcc.device_count() >= 0


def test_without_the_door_a_call_names_the_rebuild(monkeypatch):
    monkeypatch.setattr(fcc, "_cuda", None)
    monkeypatch.setattr(fcc, "_missing", "not built", raising=False)
    assert fcc.device_count() == 0 and not fcc.available()
    with pytest.raises(RuntimeError, match="FLASHCACHE_PYTHON_CUDA=ON"):
        fcc.compress_model([torch.zeros(2, 8, 4)], [torch.zeros(2, 8, 4)])


def test_cpu_tensors_are_sent_to_the_cpu_call_by_name(monkeypatch):
    if not fc.has_cuda:
        monkeypatch.setattr(fcc, "_cuda", object())  # past the door check, to the device check
    with pytest.raises(ValueError, match="not a CUDA device"):
        fcc.compress_model([torch.zeros(2, 8, 4)], [torch.zeros(2, 8, 4)])


@needs_door
def test_the_door_refuses_host_memory_and_wrong_results_by_name():
    core = fc._core
    args = ("hnd", core.Budget.ratio(0.5), fc.Options()._to_core(), 0, 0, lambda n: None)
    outs = (torch.zeros(1, 2, 8, dtype=torch.int32), torch.zeros(1, 2, dtype=torch.int32), torch.zeros(1))
    with pytest.raises(ValueError, match=r"k\[0\]: expected a CUDA tensor"):
        fcc._cuda.compress_model([torch.zeros(2, 8, 4)], [torch.zeros(2, 8, 4)], *args, *outs)
    with pytest.raises(ValueError, match="no layers"):
        fcc._cuda.compress_model([], [], *args, *outs)
    with pytest.raises(ValueError, match="layout 'xyz'"):
        fcc._cuda.compress_model([torch.zeros(2, 8, 4)], [torch.zeros(2, 8, 4)], "xyz", *args[1:], *outs)


def _cuda_pair(rng, dtype, layout="hnd", heads=3, tokens=157, dim=40):
    k, v = random_kv(rng, heads, tokens, dim)
    if layout == "nhd":
        k, v = k.transpose(1, 0, 2).copy(), v.transpose(1, 0, 2).copy()
    return torch.from_numpy(k).to("cuda", dtype), torch.from_numpy(v).to("cuda", dtype)


@needs_device
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["hnd", "nhd"])
@pytest.mark.parametrize("preset", ["defaults", "blocked"])
def test_the_gpu_keeps_what_the_cpu_keeps(rng, dtype, layout, preset):
    options = fc.Options()
    if preset == "blocked":
        options.score.transform = "blocked"
    layers = [_cuda_pair(rng, dtype, layout) for _ in range(4)]
    ks, vs = [k for k, _ in layers], [v for _, v in layers]
    gpu = fc.compress_model(ks, vs, 0.25, options, layout=layout)  # CUDA tensors: the GPU door
    cpu = fc.compress_model([k.cpu() for k in ks], [v.cpu() for v in vs], 0.25, options, layout=layout)
    np.testing.assert_array_equal(gpu.budgets.numpy(), cpu.budgets.numpy())
    np.testing.assert_allclose(gpu.energy_ratio.numpy(), cpu.energy_ratio.numpy(), rtol=1e-3)
    for layer, (g, c) in enumerate(zip(gpu.layers, cpu.layers)):
        assert g.kept.device.type == "cuda" and g.k.device.type == "cuda" and g.scores is None
        kept = g.kept.cpu().numpy()
        assert (np.diff(kept, axis=1) > 0).all(), "kept indices ascend"
        # Planted outliers are clear choices: both keep them all; ties among the rest may differ by rounding.
        for h in range(kept.shape[0]):
            same = len(set(kept[h]) & set(c.kept[h].numpy()))
            assert same >= 0.95 * kept.shape[1], f"layer {layer} head {h}: {same} of {kept.shape[1]} shared"
        rows = ks[layer] if layout == "hnd" else ks[layer].transpose(0, 1)
        expect = rows.gather(1, g.kept[:, :, None].expand(-1, -1, rows.shape[2]))
        assert torch.equal(g.k, expect)


@needs_device
def test_the_gpu_door_refuses_mixed_devices_dtypes_and_shapes(rng):
    k, v = _cuda_pair(rng, torch.float32)
    with pytest.raises(TypeError, match="one dtype"):
        fc.compress_model([k, k.half()], [v, v.half()])
    with pytest.raises(ValueError, match="one shape"):
        fc.compress_model([k, k[:, :100]], [v, v[:, :100]])
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        fc.compress_model([k, k.cpu()], [v, v.cpu()])
    with pytest.raises(ValueError, match="takes no masks"):
        fc.compress_model([k], [v], masks=[torch.ones(157, dtype=torch.bool)])
    with pytest.raises(fc.Error, match="400"):
        fc.compress_model([k], [v], keep=400)
