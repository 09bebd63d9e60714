"""The transformers cache helper: real compaction, memory released, the same greedy tokens as masking."""

import gc
import weakref

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the transformers cache tests skip")
pytest.importorskip("transformers", reason="transformers is not installed: the transformers cache tests skip")

import flashcache as fc  # noqa: E402
import flashcache.hf as fh  # noqa: E402
from tiny_model import prefill, tiny_llama  # noqa: E402


def masked_attention(evicted):
    """sdpa over the full cache with each (layer, KV head)'s evicted keys masked: the reference."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attend(module, query, key, value, attention_mask, **kwargs):
        drop = evicted[module.layer_idx]  # [batch, kv_heads, context]
        b, hk, n = drop.shape
        allow = torch.ones(b, hk, query.shape[-2], key.shape[-2], dtype=torch.bool)
        allow[..., :n] = ~drop[:, :, None, :]
        allow = allow.repeat_interleave(query.shape[1] // hk, dim=1)
        if attention_mask is not None:
            allow &= attention_mask.bool() if attention_mask.dtype == torch.bool else attention_mask == 0
        elif query.shape[-2] > 1:
            allow &= torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool).tril(key.shape[-2] - query.shape[-2])
        return sdpa_attention_forward(module, query, key, value, allow, is_causal=False, **kwargs)

    return attend


@pytest.mark.parametrize("allocation", ["dynamic", "uniform"])
def test_compaction_frees_memory_and_decodes_as_masking_does(allocation):
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    model = tiny_llama()
    torch.manual_seed(3)
    ids, question = torch.randint(0, 256, (1, 400)), torch.randint(0, 256, (1, 9))
    options = fc.Options(allocate=fc.AllocateOptions(mode=allocation))
    cache = prefill(model, ids)
    old = weakref.ref(cache.layers[0].keys)
    result = fh.compress_cache(cache, 0.2, options, model=model)
    gc.collect()
    assert old() is None  # the full tensors are gone, not masked
    assert result.bytes_after <= 0.21 * result.bytes_before
    lengths = {cache.layers[i].keys.shape[2] for i in result.layers}
    assert (len(lengths) > 1) == (allocation == "dynamic")
    fh.ragged_attention(model)
    compact = fh.generate(model, cache, question, result.next_position, 12)

    # The same kept sets as masks over the full cache, decoded by the stock positions.
    evicted = {}
    for i, kept in zip(result.layers, result.kept):
        drop = torch.ones(1, 2, 400, dtype=torch.bool)
        drop.scatter_(2, kept, False)
        evicted[i] = drop
    model.set_attn_implementation("sdpa")
    full = prefill(model, ids)  # the context itself is read whole, as it was for the compaction
    AttentionInterface.register("masked_sdpa_test", masked_attention(evicted))
    AttentionMaskInterface.register("masked_sdpa_test", sdpa_mask)
    model.set_attn_implementation("masked_sdpa_test")
    masked = fh.generate(model, full, question, 400, 12)
    assert torch.equal(compact, masked)


def test_sliding_layers_are_left_alone_and_refused_when_named():
    from transformers import DynamicCache

    model = tiny_llama()
    cache = prefill(model, torch.randint(0, 256, (1, 100)))
    model.config.layer_types = ["sliding_attention", "full_attention"] * 2
    result = fh.compress_cache(cache, 0.5, model=model)
    assert result.layers == [1, 3]
    assert cache.layers[0].keys.shape[2] == 100
    assert isinstance(cache, DynamicCache)


def test_bad_requests_are_refused_by_name():
    model = tiny_llama()
    cache = prefill(model, torch.randint(0, 256, (2, 64)))
    with pytest.raises(ValueError, match="a batch of 2 sequences with dynamic allocation"):
        fh.compress_cache(cache, 0.5, model=model)
    with pytest.raises(ValueError, match="layer 7 of a cache of 4"):
        fh.compress_cache(cache, 0.5, layers=[7])
    uniform = fc.Options(allocate=fc.AllocateOptions(mode="uniform"))
    result = fh.compress_cache(cache, 0.5, uniform, model=model)
    assert result.kept[0].shape == (2, 2, 32)
