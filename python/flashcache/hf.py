"""A transformers cache that really shrinks: compaction of a DynamicCache to the kept tokens.

``compress_cache`` scores a prefilled cache with flashcache and replaces each compressed layer's
K and V by new tensors holding only the kept tokens of every KV head; the old tensors are
released (nothing is masked). RoPE is already in the cached keys, so the kept ones stay valid;
what changes is that the next token's position is no longer the cache's length: pass
``position_ids`` from ``CacheCompression.next_position`` (``generate`` below does), as kvpress's
pipeline does after its presses.

Layers of different lengths (the default dynamic allocation) need an attention that takes each
layer's own key length: ``ragged_attention(model)`` installs one (sdpa with the causal mask
rebuilt per layer); with ``allocation="uniform"`` every layer keeps the same count and the stock
attention works. Gemma 3's sliding-window layers are left as they are (only global layers are
compressed), as the library does inside llama.cpp.

Needs torch and transformers (``pip install flashcache[hf]``).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from ._core import Allocation
from .compress import compress_model
from .options import Options, SharedKeepOptions

# No "flash" in the name: transformers takes any such name for a flash-attention kernel.
RAGGED_ATTENTION = "ragged_sdpa"


@dataclass
class CacheCompression:
    """What ``compress_cache`` did: per compressed layer its kept indices [batch, kv_heads, budget]."""

    layers: list[int]  # the cache layers compressed
    kept: list[torch.Tensor]  # per compressed layer, int64 [batch, kv_heads, budget], ascending
    tokens_before: int  # the context's length: the next token's position
    bytes_before: int  # K and V bytes of the compressed layers, before and after
    bytes_after: int

    @property
    def next_position(self) -> int:
        return self.tokens_before


def global_layers(model: Any, cache: Any) -> list[int]:
    """The layers to compress: those not sliding-window (the model's config.layer_types, else the cache's)."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    types = getattr(config, "layer_types", None) if config is not None else None
    if types is not None:
        return [i for i, t in enumerate(types) if t not in ("sliding_attention", "chunked_attention")]
    return [i for i, layer in enumerate(cache.layers) if not getattr(layer, "is_sliding", False)]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@torch.no_grad()
def kept_sets(
    cache: Any,
    keep: float | int,
    options: Options,
    *,
    model: Any = None,
    layers: Sequence[int] | None = None,
    one_length: bool = False,
    shared: SharedKeepOptions | None = None,
    who: str = "compress_cache",
) -> tuple[list[int], list[list[torch.Tensor]]]:
    """What flashcache keeps of a prefilled cache: the layers chosen, and per chosen layer and
    sequence the kept indices [kv_heads, budget] (int64, ascending), the cache left as it is.

    Each sequence of the batch is compressed on its own (its budgets by layer may differ under
    dynamic allocation); ``one_length`` refuses that case, for a caller that needs one length a layer.
    ``shared``: one set for the heads of a layer, or for every layer and head (default: per head).
    """
    chosen = list(layers) if layers is not None else global_layers(model, cache)
    if not chosen:
        raise ValueError(f"{who}: no layer to compress")
    n_layers = len(cache.layers)
    for i in chosen:
        if not 0 <= i < n_layers:
            raise ValueError(f"{who}: layer {i} of a cache of {n_layers}")
        if getattr(cache.layers[i], "is_sliding", False):
            raise ValueError(f"{who}: layer {i} is a sliding-window layer; it keeps its own window")
    keys = [cache.layers[i].keys for i in chosen]
    values = [cache.layers[i].values for i in chosen]
    batch, _, tokens, _ = keys[0].shape
    for i, k in zip(chosen, keys):
        if k.shape[0] != batch or k.shape[2] != tokens:
            raise ValueError(
                f"{who}: layer {i} holds {tuple(k.shape)}, layer {chosen[0]} {tuple(keys[0].shape)}"
                " (every compressed layer needs the same batch and tokens)"
            )
        if k.device.type != "cpu":
            raise ValueError(f"{who}: layer {i} is on {k.device}; this helper compresses CPU caches")
    if one_length and batch > 1 and options.allocate.mode == Allocation.dynamic:
        raise ValueError(
            f"{who}: a batch of {batch} sequences with dynamic allocation would give each "
            "sequence its own layer lengths; use Options(allocate=AllocateOptions(mode='uniform'))"
        )
    kept: list[list[torch.Tensor]] = [[] for _ in chosen]
    for b in range(batch):
        result = compress_model([k[b] for k in keys], [v[b] for v in values], keep, options, shared=shared)
        for j, layer in enumerate(result.layers):
            kept[j].append(torch.as_tensor(layer.kept).to(torch.int64))
    return chosen, kept


@torch.no_grad()
def compress_cache(
    cache: Any,
    keep: float | int = 0.2,
    options: Options | None = None,
    *,
    model: Any = None,
    layers: Sequence[int] | None = None,
) -> CacheCompression:
    """Compacts a prefilled DynamicCache in place to ``keep`` of its tokens per layer and KV head.

    ``options.allocate`` splits the total over the layers by their energy ratio (dynamic, the
    default: layers of different lengths, see ``ragged_attention``) or evenly (uniform). Every
    sequence of the batch is compressed on its own; with dynamic allocation a batch must be of
    one sequence, since a layer's tensor holds one length. ``layers``: which layers (default:
    the global ones of ``model``, or every layer the cache does not mark sliding).
    """
    chosen, kept = kept_sets(cache, keep, options or Options(), model=model, layers=layers, one_length=True)
    tokens = cache.layers[chosen[0]].keys.shape[2]
    before = after = 0
    kept_out = []
    for i, per_seq in zip(chosen, kept):
        layer = cache.layers[i]
        index = torch.stack(per_seq)  # [batch, kv_heads, budget]
        gather = index.unsqueeze(-1).expand(-1, -1, -1, layer.keys.shape[-1])
        before += _nbytes(layer.keys) + _nbytes(layer.values)
        layer.keys = layer.keys.gather(2, gather).contiguous()
        layer.values = layer.values.gather(2, gather).contiguous()
        after += _nbytes(layer.keys) + _nbytes(layer.values)
        kept_out.append(index)
    return CacheCompression(chosen, kept_out, tokens, before, after)


def _ragged_sdpa(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
):
    """sdpa with the mask fitted to this layer's keys: the past ones all visible, the new ones causal."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is not None and attention_mask.shape[-1] != key.shape[-2]:
        q = query.shape[-2]
        new = attention_mask[..., -q:]  # the causal block over the new tokens
        past = key.shape[-2] - q
        visible = torch.ones if attention_mask.dtype == torch.bool else torch.zeros
        pad = visible((*attention_mask.shape[:-1], past), dtype=attention_mask.dtype, device=attention_mask.device)
        attention_mask = torch.cat([pad, new], dim=-1)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def ragged_attention(model: Any) -> None:
    """Lets ``model`` attend over a cache whose layers hold different numbers of tokens.

    Registers sdpa with a per-layer mask under the name ``ragged_sdpa`` and switches the
    model to it. A batch padded on the left is not supported by this attention.
    """
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(RAGGED_ATTENTION, _ragged_sdpa)
    AttentionMaskInterface.register(RAGGED_ATTENTION, sdpa_mask)
    model.set_attn_implementation(RAGGED_ATTENTION)


@torch.no_grad()
def generate(
    model: Any,
    cache: Any,
    input_ids: torch.Tensor,
    position: int,
    max_new_tokens: int,
    eos_token_id: int | Sequence[int] | None = None,
) -> torch.Tensor:
    """Greedy tokens after ``input_ids`` over a (compressed) cache, the first at ``position``.

    The prompt goes in one forward with its positions given explicitly, then one token at a
    time; stops at an eos token. Returns the new tokens [batch, <= max_new_tokens].
    """
    eos = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id or ())
    q = input_ids.shape[1]
    positions = torch.arange(position, position + q, device=input_ids.device)[None].expand(input_ids.shape[0], -1)
    out = model(input_ids=input_ids, past_key_values=cache, position_ids=positions, use_cache=True)
    tokens = []
    next_pos = position + q
    for _ in range(max_new_tokens):
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(token)
        if eos and all(int(t) in eos for t in token[:, 0]):
            break
        ids = torch.full((input_ids.shape[0], 1), next_pos, device=input_ids.device)
        out = model(input_ids=token, past_key_values=cache, position_ids=ids, use_cache=True)
        next_pos += 1
    return torch.cat(tokens, dim=1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def attention_queries(module: Any, hidden: torch.Tensor, position_embeddings: tuple) -> torch.Tensor:
    """An attention module's queries [batch, q_heads, tokens, head_dim] for its input ``hidden``, after
    RoPE: its ``q_proj``, its ``q_norm`` where it has one (Qwen3, Gemma 3), the rotate-half RoPE of
    Llama, Qwen and Gemma with the model's (cos, sin)."""
    if not hasattr(module, "q_proj"):
        raise ValueError(f"{type(module).__name__} has no q_proj (Llama-like attention only)")
    batch, tokens, _ = hidden.shape
    q = module.q_proj(hidden).view(batch, tokens, -1, module.head_dim).transpose(1, 2)
    if hasattr(module, "q_norm"):
        q = module.q_norm(q)
    cos, sin = position_embeddings
    return q * cos.unsqueeze(1) + _rotate_half(q) * sin.unsqueeze(1)


@contextmanager
def captured_queries(model: Any, layers: Sequence[int]) -> Generator[dict[int, torch.Tensor], None, None]:
    """While open, every forward of the model leaves in ``queries[layer]`` that layer's queries
    [batch, q_heads, tokens, head_dim] after RoPE (and the q-norm of Qwen3 and Gemma 3), as its
    attention saw them: what a later question's recall scores the archive with.

    The queries are recomputed from the attention's inputs (``attention_queries``) in a hook that
    changes nothing.
    """
    base = getattr(model.model, "language_model", model.model)
    queries: dict[int, torch.Tensor] = {}
    handles = []

    def hook_for(layer: int) -> Any:
        def hook(module: Any, args: tuple, kwargs: dict) -> None:
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            queries[layer] = attention_queries(module, hidden, kwargs["position_embeddings"])

        return hook

    try:
        for layer in layers:
            handles.append(base.layers[layer].self_attn.register_forward_pre_hook(hook_for(layer), with_kwargs=True))
        yield queries
    finally:
        for handle in handles:
            handle.remove()
