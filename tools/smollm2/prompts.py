"""Prompts: the needle in a haystack (filler sentences, planted fact, question), and the
token range of a text inside a tokenised prompt."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from .tokenizer import BPETokenizer

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
