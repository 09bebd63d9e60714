"""Decoding on top of a (possibly compressed) cache: greedy decoding, continuation NLL."""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from .kv import KVCache
from .model import SmolLM2


def greedy_decode(model: SmolLM2, cache: KVCache, first_logits: np.ndarray, n_new: int,
                  stop_at_eos: bool = True) -> Tuple[List[int], np.ndarray]:
    """Greedy decoding on top of a (possibly compressed) ``cache``.

    ``first_logits`` are the logits of the last token already in the cache (the prefill
    output: compression happens after prefill). Returns the new token ids and the logits
    that chose them ([n, vocab]). Stops after <|im_end|> / <|endoftext|> when
    ``stop_at_eos``.
    """
    stops = {model.tokenizer.eos_id, model.tokenizer.special.get("<|endoftext|>", -1)}
    out, chosen_by = [], []
    logits = np.asarray(first_logits, np.float32).reshape(-1)
    for step in range(n_new):
        chosen_by.append(logits)
        nxt = int(np.argmax(logits))
        out.append(nxt)
        if (stop_at_eos and nxt in stops) or step == n_new - 1:
            break
        res = model.forward([nxt], cache, all_logits=False)
        cache, logits = res.cache, res.logits[-1]
    return out, np.stack(chosen_by)


def greedy_generate(model: SmolLM2, ids: Sequence[int], n_new: int,
                    stop_at_eos: bool = True) -> Tuple[List[int], np.ndarray]:
    """Prefill ``ids`` with a full cache, then ``greedy_decode``."""
    res = model.forward(ids, all_logits=False)
    return greedy_decode(model, res.cache, res.logits[-1], n_new, stop_at_eos)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def continuation_nll(model: SmolLM2, prompt_cache: KVCache, first_logits: np.ndarray,
                     continuation: Sequence[int]) -> np.ndarray:
    """Per-token NLL (nats) of ``continuation`` decoded on top of ``prompt_cache``.

    ``first_logits`` are the prefill logits of the last prompt token: compression happens
    after prefill, so the first continuation token is predicted from the full cache; the
    rest are predicted by feeding continuation tokens on top of the (possibly compressed)
    ``prompt_cache``, teacher-forced.
    """
    continuation = list(continuation)
    logits = [np.asarray(first_logits, np.float32).reshape(1, -1)]
    if len(continuation) > 1:
        logits.append(model.forward(continuation[:-1], prompt_cache).logits)
    lp = log_softmax(np.concatenate(logits))
    return -lp[np.arange(len(continuation)), continuation]
