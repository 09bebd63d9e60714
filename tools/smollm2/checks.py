"""The forward-pass checks printed by ``extract_llm.py --verify`` and recorded in the fixtures."""

from __future__ import annotations

import time
from typing import Dict

import numpy as np

from .decode import greedy_generate
from .model import SmolLM2

DEMO_PROMPT = "Give three tips for staying healthy."


def verify(model: SmolLM2, n_new: int = 48) -> Dict:
    """Prove the forward pass: coherent greedy text, and cached decoding == full forward."""
    tok = model.tokenizer
    report = {}
    ids = tok.encode(tok.chat(DEMO_PROMPT))
    t0 = time.time()
    new, step_logits = greedy_generate(model, ids, n_new)
    report["chat_prompt"] = DEMO_PROMPT
    report["chat_continuation"] = tok.decode(new)
    print(f"[verify] greedy answer to {DEMO_PROMPT!r} ({len(new)} tokens in "
          f"{time.time() - t0:.1f}s):\n{tok.decode(new)}\n")

    plain = "The capital of France is"
    pids = tok.encode(plain)
    cont, _ = greedy_generate(model, pids, 16, stop_at_eos=False)
    report["plain_prompt"], report["plain_continuation"] = plain, tok.decode(cont)
    print(f"[verify] {plain!r} -> {tok.decode(cont)!r}")

    # Incremental decoding through the KV cache must equal one full forward pass.
    full = model.forward(ids + new[:-1]).logits[len(ids) - 1:]
    diff = float(np.max(np.abs(full - step_logits)))
    report["cached_vs_full_forward_max_abs_logit_diff"] = diff
    print(f"[verify] cached decode vs full forward: max |logit diff| = {diff:.2e}")
    return report
