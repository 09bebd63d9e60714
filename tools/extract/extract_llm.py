#!/usr/bin/env python3
"""Real KV caches from SmolLM2-135M-Instruct, with a forward pass written in numpy.

The command line of the numpy reference model (the package tools/smollm2: tokenizer,
model, KV cache, decoding, prompts): the prompt modes below, each written as a fixture
folder (fixture_io.py), and ``--verify``. ``make_fixtures.py`` calls ``save_extraction``
for the committed fixtures. The model's API is the package's; see its docstring.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Dict, Optional, Sequence

import _paths  # noqa: F401  (tools/ on sys.path: the smollm2 package)
import fixture_io
from smollm2 import (
    MODEL_NAME,
    Extraction,
    SmolLM2,
    build_meta,
    extract,
    find_text_range,
    greedy_generate,
    needle_prompt,
    verify,
)


def save_extraction(model: SmolLM2, ex: Extraction, out_dir: str, prompt: str,
                    layers: Optional[Sequence[int]] = None, dtype: str = "float16",
                    mode: str = "prompt", extra: Optional[Dict] = None) -> Dict:
    layers = list(range(model.n_layers)) if layers is None else list(layers)
    arrays = {"k": ex.k[layers], "v": ex.v[layers], "q": ex.q[layers]}
    return fixture_io.write_fixture(out_dir, arrays,
                                    build_meta(model, ex, prompt, layers, mode, extra), dtype)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["prompt", "heldout", "needle"], default="prompt",
                    help="prompt: the prompt only; heldout: prompt + continuation tokens "
                         "(ground-truth --continuation text or greedy); needle: a fact "
                         "planted in filler, question at the end")
    ap.add_argument("--prompt", default=None, help="prompt text")
    ap.add_argument("--prompt-file", default=None, help="read the prompt from a file")
    ap.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    ap.add_argument("--continuation", default=None,
                    help="heldout mode: ground-truth continuation text (else greedy)")
    ap.add_argument("--continuation-tokens", type=int, default=64)
    ap.add_argument("--needle-filler-tokens", type=int, default=400)
    ap.add_argument("--needle-depth", type=float, default=0.4)
    ap.add_argument("--needle-code", default="7421")
    ap.add_argument("--layers", default=None, help="comma-separated layer indices to keep")
    ap.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    ap.add_argument("--out", default=None, help="output folder (k.npy, v.npy, q.npy, meta.json)")
    ap.add_argument("--verify", action="store_true", help="print the forward-pass checks")
    args = ap.parse_args(argv)

    t0 = time.time()
    model = SmolLM2.load()
    print(f"loaded {MODEL_NAME} in {time.time() - t0:.1f}s: {model.n_layers} layers, "
          f"{model.n_heads} q heads, {model.n_kv_heads} kv heads, head dim {model.head_dim}")
    if args.verify:
        verify(model)
    if args.out is None:
        return 0

    tok = model.tokenizer
    prompt = args.prompt
    if args.prompt_file:
        with open(args.prompt_file, encoding="utf-8") as f:
            prompt = f.read()
    extra: Dict = {}
    if args.mode == "needle":
        prompt, needle = needle_prompt(tok, args.needle_filler_tokens, args.needle_depth,
                                       args.needle_code)
        ex = extract(model, prompt, n_continuation=0)
        answer, _ = greedy_generate(model, ex.ids, 24)
        text = tok.decode(answer)
        extra = {"needle": needle, "needle_answer": args.needle_code,
                 "needle_token_range": find_text_range(tok, ex.ids, needle),
                 "model_answer_full_cache": text,
                 "needle_found_full_cache": args.needle_code in text}
        print(f"needle answer with the full cache: {text!r} "
              f"({'correct' if args.needle_code in text else 'WRONG'})")
    else:
        if prompt is None:
            ap.error("--prompt or --prompt-file is required for this mode")
        prompt = tok.chat(prompt) if args.chat else prompt
        n_cont = args.continuation_tokens if args.mode == "heldout" else 0
        ex = extract(model, prompt, n_cont, args.continuation if args.mode == "heldout" else None)
    layers = [int(s) for s in args.layers.split(",")] if args.layers else None
    meta = save_extraction(model, ex, args.out, prompt, layers, args.dtype, args.mode, extra)
    print(f"wrote {args.out}: shapes {meta['shapes']}, {fixture_io.dir_size_bytes(args.out)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
