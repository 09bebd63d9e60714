#!/usr/bin/env python3
"""Check tools/smollm2's numpy forward pass and tokenizer against independent code.

1. Logits vs llama.cpp. No current llama.cpp binding has a prebuilt wheel on PyPI
   (llama-cpp-python is source-only and needs a long compile), but ``ctransformers``
   0.2.27 ships a prebuilt llama.cpp (ggml, September 2023). That build predates this
   GGUF, so we feed it a *compatible copy* written to a temporary folder, with the same
   tensors byte for byte:
     - header version 2 instead of 3 (same layout for little-endian files),
     - an explicit ``output.weight`` (a copy of ``token_embd.weight``: the old loader does
       not know tied embeddings),
     - a dummy ``tokenizer.ggml.scores`` array (the old loader requires it),
     - the last vocabulary entry renamed to a raw newline (the old BPE loader tokenises
       "\\n" without byte mapping at load time and aborts otherwise).
   Token ids are fed directly, so its (old, incomplete) tokenizer is never used; the
   renamed entry is a rare token that does not occur in the test text.
   llama.cpp multiplies Q4_1 weights with activations quantised to 8 bits, so its logits
   differ from our float32 ones by quantisation noise; we report the max/mean absolute
   difference, the top-1 agreement and the greedy continuation of both.
2. Tokenizer vs Hugging Face ``tokenizers`` (Rust), built from the GGUF's vocabulary and
   merges with SmolLM2's pre-tokeniser (individual digits, then GPT-2 byte-level split).

Install: ``python3 -m pip install --no-deps ctransformers==0.2.27`` (plus
``tokenizers``); each check is skipped with a message when its package is missing.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import types
from typing import Dict, List

import _paths  # noqa: F401  (tools/ on sys.path: the smollm2 package)
import numpy as np
import smollm2
from smollm2 import SmolLM2, find_gguf, greedy_generate, log_softmax

TEST_TEXT = ("The history of the bicycle begins in the early nineteenth century. "
             "Early designs had no pedals: riders pushed themselves along with their feet. "
             "Later machines added cranks to the front wheel, which grew very large so that "
             "one turn of the pedals carried the rider further. These tall bicycles were "
             "fast but dangerous, and a fall from one could cause serious injuries. The "
             "safety bicycle, with two wheels of equal size and a chain driving the rear "
             "wheel, solved the problem and quickly became popular with riders of all "
             "ages. Air-filled tyres made the ride smoother still, and by the end of the "
             "century millions of people used bicycles for work and for pleasure.")


def write_legacy_gguf(src: str, dst: str) -> None:
    """The compatible copy described in the module docstring."""
    import gguf

    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, arch=reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # written by GGUFWriter itself
        value = field.contents()
        if key == "tokenizer.ggml.tokens":
            value = list(value)
            value[-1] = "\n"
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, value, field.types[0], sub_type=field.types[-1])
        else:
            writer.add_key_value(key, value, field.types[0])
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    writer.add_token_scores([0.0] * n_vocab)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
        if t.name == "token_embd.weight":
            embedding = t
    writer.add_tensor("output.weight", embedding.data, raw_shape=embedding.data.shape,
                      raw_dtype=embedding.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with open(dst, "r+b") as f:   # header: b"GGUF" + uint32 version
        f.seek(4)
        f.write((2).to_bytes(4, "little"))


def _import_ctransformers():
    """Import ctransformers' LLM class. Its package __init__ imports huggingface_hub for
    downloads we never make; stub it when absent."""
    if importlib.util.find_spec("huggingface_hub") is None:
        hub = types.ModuleType("huggingface_hub")
        hub.HfApi, hub.snapshot_download = None, None
        utils = types.ModuleType("huggingface_hub.utils")
        utils.validate_repo_id, utils.HFValidationError = None, Exception
        sys.modules.update({"huggingface_hub": hub, "huggingface_hub.utils": utils})
    from ctransformers.llm import LLM, Config
    return LLM, Config


def _cpu_lib() -> str:
    """ctransformers' build for this CPU (its own detection needs py-cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return "basic"
    return "avx2" if " avx2" in flags else ("avx" if " avx " in flags else "basic")


def compare_with_llamacpp(model: SmolLM2, n_greedy: int = 24) -> Dict:
    if importlib.util.find_spec("ctransformers") is None:
        print("[reference] ctransformers not installed: llama.cpp comparison skipped")
        return {"llamacpp": "skipped (ctransformers not installed)"}
    LLM, Config = _import_ctransformers()
    tok = model.tokenizer
    ids = tok.encode(TEST_TEXT)
    renamed = len(tok.tokens) - 1   # the vocabulary entry write_legacy_gguf renames
    assert renamed not in ids
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "smollm2_legacy.gguf")
        write_legacy_gguf(find_gguf(), path)
        ref = LLM(model_path=path, model_type="llama", lib=_cpu_lib(),
                  config=Config(context_length=512, threads=1, batch_size=1))
        # Feed one token at a time so that we can read the logits of every position.
        ref_logits: List[np.ndarray] = []
        for i in ids:
            ref.eval([i])
            ref_logits.append(np.array(ref.logits, dtype=np.float32))
        ref_new: List[int] = []
        for _ in range(n_greedy):
            nxt = int(np.argmax(ref_logits[-1]))
            ref_new.append(nxt)
            ref.eval([nxt])
            ref_logits.append(np.array(ref.logits, dtype=np.float32))
    ref_logits_arr = np.stack(ref_logits[:len(ids)])
    ours = model.forward(ids).logits
    diff = np.abs(ours - ref_logits_arr)
    top1 = float(np.mean(ours.argmax(-1) == ref_logits_arr.argmax(-1)))
    # KL(llama.cpp || ours) of the next-token distributions, nats per position.
    lp_ref, lp_ours = log_softmax(ref_logits_arr), log_softmax(ours)
    kl = float(np.mean(np.sum(np.exp(lp_ref) * (lp_ref - lp_ours), axis=-1)))
    our_new, _ = greedy_generate(model, ids, n_greedy, stop_at_eos=False)
    report = {
        "llamacpp_build": f"ctransformers 0.2.27 (llama.cpp/ggml, Sept 2023), "
                          f"{_cpu_lib()} build",
        "text_tokens": len(ids),
        "max_abs_logit_diff": float(diff.max()),
        "mean_abs_logit_diff": float(diff.mean()),
        # RoPE or cache errors would grow with position; quantisation noise does not.
        "mean_abs_logit_diff_first_half": float(diff[: len(ids) // 2].mean()),
        "mean_abs_logit_diff_second_half": float(diff[len(ids) // 2:].mean()),
        "logit_std": float(ref_logits_arr.std()),
        "top1_agreement": top1,
        "mean_kl_nats": kl,
        "greedy_ours": tok.decode(our_new),
        "greedy_llamacpp": tok.decode(ref_new),
        "greedy_identical_tokens": sum(a == b for a, b in zip(our_new, ref_new)),
        "greedy_first_mismatch": next((i for i, (a, b) in enumerate(zip(our_new, ref_new))
                                       if a != b), None),
    }
    print(f"[reference] llama.cpp vs numpy on {len(ids)} tokens: max |logit diff| "
          f"{report['max_abs_logit_diff']:.3f}, mean {report['mean_abs_logit_diff']:.4f} "
          f"(logit std {report['logit_std']:.2f}), top-1 agreement {top1:.3f}, "
          f"mean KL {kl:.4f} nats")
    print(f"[reference] mean |logit diff| first half {report['mean_abs_logit_diff_first_half']:.4f}"
          f", second half {report['mean_abs_logit_diff_second_half']:.4f}")
    print(f"[reference] greedy (numpy)   : {report['greedy_ours']!r}")
    print(f"[reference] greedy (llama.cpp): {report['greedy_llamacpp']!r}")
    return report


def hf_tokenizer_from_gguf(model: SmolLM2):
    """A ``tokenizers.Tokenizer`` built from the GGUF vocabulary (independent BPE code)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = model.tokenizer
    merges = sorted(tok.ranks, key=tok.ranks.get)   # (left, right) pairs in rank order
    bpe = models.BPE(vocab=dict(tok.token_to_id), merges=merges)
    hf = Tokenizer(bpe)
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken(s, special=True, normalized=False)
                           for s in sorted(tok.special, key=tok.special.get)])
    return hf


TOKENIZER_SAMPLES = [
    TEST_TEXT,
    "Hello   world!! It's 2024, isn't it?  12345 apples\n\n\tand   \u00e9t\u00e9 caf\u00e9 \u4e2d\u6587",
    "def f(x):\n    return x ** 2  # square\n",
    "<|im_start|>user\nWhat's 7 x 8?<|im_end|>\n<|im_start|>assistant\n",
    smollm2.__doc__,   # a longer real text with code, punctuation and newlines
]


def compare_tokenizers(model: SmolLM2) -> Dict:
    if importlib.util.find_spec("tokenizers") is None:
        print("[reference] tokenizers not installed: tokenizer comparison skipped")
        return {"tokenizer": "skipped (tokenizers not installed)"}
    hf = hf_tokenizer_from_gguf(model)
    mismatches = []
    for text in TOKENIZER_SAMPLES:
        ours = model.tokenizer.encode(text)
        theirs = hf.encode(text).ids
        if ours != theirs:
            mismatches.append({"text": text, "ours": ours, "tokenizers": theirs})
    print(f"[reference] tokenizer vs HF tokenizers: "
          f"{len(TOKENIZER_SAMPLES) - len(mismatches)}/{len(TOKENIZER_SAMPLES)} samples identical")
    return {"tokenizer_samples": len(TOKENIZER_SAMPLES), "tokenizer_mismatches": mismatches}


def main() -> int:
    model = SmolLM2.load()
    report = {}
    report.update(compare_tokenizers(model))
    report.update(compare_with_llamacpp(model))
    return 0 if not report.get("tokenizer_mismatches") else 1


if __name__ == "__main__":
    sys.exit(main())
