"""A tiny random Llama (2 KV heads, 4 layers) for the torch-side tests: no download, a second to build."""

import torch


def tiny_llama(layers=4, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).eval()


def tiny_gemma3(window=64, seed=0):
    """Gemma 3's layout: sliding-window layers (a window of ``window`` tokens) between global ones."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=window,
        layer_types=["sliding_attention", "full_attention"] * 2,
        max_position_embeddings=4096,
        attn_implementation="sdpa",
    )
    return Gemma3ForCausalLM(config).eval()


def prefill(model, ids, with_config=False):
    """The prefilled cache; ``with_config``: a cache that knows the model's layer kinds."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config) if with_config else DynamicCache()
    with torch.no_grad():
        model.model(input_ids=ids, past_key_values=cache)
    return cache
