"""SmolLM2's tokenizer: GPT-2 style byte-level BPE, vocabulary and merges read from the GGUF."""

from __future__ import annotations

import math
from typing import Dict, List, Sequence

# Default system prompt of the model's chat template (stored in the GGUF).
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def byte_to_unicode() -> Dict[int, str]:
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
        self._b2u = byte_to_unicode()
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
