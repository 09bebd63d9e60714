"""torch tensors through the door: zero-copy, bfloat16, results as tensors (skips by name without torch)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the torch tests skip")

import flashcache as fc  # noqa: E402


def test_tensors_are_read_in_place_and_results_are_tensors():
    torch.manual_seed(0)
    cache = torch.randn(1, 4, 300, 64)  # [batch, kv_heads, tokens, dim], as transformers holds it
    k, v = cache[0], cache[0] * 0.5
    info = fc._core.view_info(k, fc._core.Layout.hnd)
    assert info[0] == k.data_ptr()
    out = fc.compress(k, v, 0.2)
    assert isinstance(out.kept, torch.Tensor) and isinstance(out.k, torch.Tensor)
    ref = fc.compress(k.numpy(), v.numpy(), 0.2)
    np.testing.assert_array_equal(out.kept.numpy(), ref.kept)
    np.testing.assert_array_equal(out.k.numpy(), ref.k)


def test_bfloat16_and_float16_tensors():
    torch.manual_seed(1)
    k, v = torch.randn(2, 130, 32), torch.randn(2, 130, 32)
    for dtype in (torch.bfloat16, torch.float16):
        out = fc.compress(k.to(dtype), v.to(dtype), 0.3)
        assert out.k.dtype == dtype
        gathered = k.to(dtype).gather(1, out.kept.long().unsqueeze(-1).expand(-1, -1, 32))
        assert torch.equal(out.k, gathered)


def test_a_tensor_that_requires_grad_is_detached_not_copied():
    k = torch.randn(2, 50, 16, requires_grad=True)
    out = fc.compress(k, k, 0.5)
    assert out.kept.shape == (2, 25)


def test_non_contiguous_head_dim_and_mixed_frameworks_are_refused_by_name():
    k = torch.randn(2, 50, 32)[:, :, ::2]
    with pytest.raises(ValueError, match="the head dim must be contiguous"):
        fc.compress(k, k)
    with pytest.raises(TypeError, match="k and v must both be numpy arrays or both torch tensors"):
        fc.compress(torch.randn(2, 50, 16), np.zeros((2, 50, 16), np.float32))
