"""RULER-style synthetic tasks, generated locally (no download), from the task definitions of
RULER (Hsieh et al., "RULER: What's the Real Context Size of Your Long-Context Language
Models?", arXiv 2404.06654, section 3 and appendix B): retrieval (needle in a haystack, single,
multi-key, multi-value, multi-query), multi-hop tracing (variable tracking) and aggregation
(common- and frequent-words extraction). The wording of every template is ours.

A sample is ``Sample(task, seed, context, question, answer_prefix, answers, max_new_tokens)``.
The context is what kvpress's pipeline prefills (and compresses); the question comes after it
(query-agnostic) or inside it (query-aware, see run.py). A sample is fitted to ``length`` tokens
of the model's tokenizer: context and question together, as RULER counts its lengths.

The essay haystack is prose from Debian's own documentation and the Python HOWTOs that Debian
packages (doc-debian, python3.11-doc; split.json names the files of each split and their licenses).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
SPLIT_FILE = os.path.join(HERE, "split.json")

# Our own word lists: keys are adjective-noun pairs, as RULER's keys are two random words.
ADJECTIVES = (
    "amber brave calm dusty eager faint gentle hollow icy jolly keen lively mellow narrow odd pale quiet rapid "
    "silent tender upper vivid wary young zesty bold crisp damp early fancy grand humble idle jagged kind lofty "
    "misty noble oval proud rustic sharp tidy urban vast witty brisk cozy dense elder fresh glad hazy inner"
).split()
NOUNS = (
    "anchor bridge candle desert engine forest garden harbor island jacket kettle ladder meadow needle orchard "
    "pillow quarry river saddle tunnel umbrella valley window yard zipper basket cabin dragon feather glacier "
    "hammer igloo jungle kitten lantern mirror nest ocean pepper rocket shovel tiger violin wagon barrel canyon "
    "dolphin falcon"
).split()
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


@dataclass
class Sample:
    task: str
    seed: int
    length: int
    context: str
    question: str
    answer_prefix: str
    answers: list[str]
    max_new_tokens: int

    def to_json(self) -> dict:
        return asdict(self)


def load_split() -> dict:
    with open(SPLIT_FILE, encoding="utf-8") as f:
        return json.load(f)


# ---------------------------------------------------------------------------------------------
# The essay haystack: prose paragraphs of the split's files.
# ---------------------------------------------------------------------------------------------

def _read(path: str) -> str:
    raw = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
    return raw.decode("utf-8", errors="replace")


def _prose_paragraphs(text: str) -> list[str]:
    """Paragraphs of running text: reStructuredText markup, code blocks and headings dropped."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = [ln for ln in block.splitlines() if ln.strip()]
        if not lines or lines[0].startswith(("..", "::", ">>>", "    ", "\t")):
            continue
        if all(set(ln.strip()) <= set("=-~^*_#+") for ln in lines[1:2]):  # a heading and its rule
            continue
        para = " ".join(ln.strip() for ln in lines)
        para = re.sub(r":\w+:`([^`<]*)(?:<[^>]*>)?`", r"\1", para)  # :role:`text <target>` -> text
        para = re.sub(r"`+([^`]*)`+_?", r"\1", para).replace("::", ":")
        if len(para.split()) >= 12 and sum(c.isalpha() for c in para) > 0.7 * len(para):
            out.append(para)
    return out


def essay_paragraphs(split: str) -> list[str]:
    files = [f for f in load_split()["haystack"]["files"] if f["split"] == split]
    paragraphs = []
    for f in files:
        if not os.path.exists(f["path"]):
            raise SystemExit(f"ruler: {f['path']} is missing: install the Debian package {f['package']}")
        paragraphs += _prose_paragraphs(_read(f["path"]))
    return paragraphs


# ---------------------------------------------------------------------------------------------
# Values and keys.
# ---------------------------------------------------------------------------------------------

def word_key(rng: random.Random, taken: set) -> str:
    while True:
        key = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
        if key not in taken:
            taken.add(key)
            return key


def number(rng: random.Random) -> str:
    return str(rng.randint(1_000_000, 9_999_999))


def uuid_value(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def needle(key: str, value: str, kind: str) -> str:
    return f"One of the special magic {kind} for {key} is: {value}. "


# ---------------------------------------------------------------------------------------------
# Fitting a sample to a token length: a haystack of units with needles placed at depths.
# ---------------------------------------------------------------------------------------------

Counter = Callable[[str], int]


def _insert(units: list[str], needles: list[str], rng: random.Random) -> str:
    """The haystack's units with each needle between two units at a random depth (RULER places them uniformly)."""
    slots = sorted(rng.randint(0, len(units)) for _ in needles)
    out, at = [], 0
    for slot, text in zip(slots, rng.sample(needles, len(needles))):
        out += units[at:slot] + [text]
        at = slot
    return " ".join(out + units[at:])


def fit(count: Counter, length: int, build: Callable[[int], tuple[str, str]]) -> tuple[str, str]:
    """The largest n whose build(n) = (context, question) fits `length` tokens (binary search)."""
    low, high = 0, 1
    while count("".join(build(high))) <= length:
        low, high = high, high * 2
        if high > 1 << 16:
            break
    while high - low > 1:
        mid = (low + high) // 2
        if count("".join(build(mid))) <= length:
            low = mid
        else:
            high = mid
    return build(low)


# ---------------------------------------------------------------------------------------------
# The tasks.
# ---------------------------------------------------------------------------------------------

def _niah(seed: int, length: int, count: Counter, split: str, *, haystack: str, key_kind: str, value_kind: str,
          keys: int = 1, values: int = 1, queries: int = 1) -> tuple[str, str, str, list[str]]:
    rng = random.Random(seed)
    taken: set = set()
    make_key = (lambda: uuid_value(rng)) if key_kind == "uuid" else (lambda: word_key(rng, taken))
    make_value = (lambda: uuid_value(rng)) if value_kind == "uuid" else (lambda: number(rng))
    kind = "uuids" if value_kind == "uuid" else "numbers"
    pairs = [(make_key(), [make_value() for _ in range(values)]) for _ in range(keys)]
    asked = pairs[:queries]
    needles = [needle(k, v, kind) for k, vs in pairs for v in vs]
    if haystack == "essay":
        paragraphs = essay_paragraphs(split)
        start = rng.randrange(len(paragraphs))
        pool = [paragraphs[(start + i) % len(paragraphs)] for i in range(len(paragraphs))] * 8
        units = lambda n: pool[:n]  # noqa: E731
    elif haystack == "noise":
        units = lambda n: [NOISE] * n  # noqa: E731
    else:  # "needle": a haystack of needles with keys of their own (distractors of the same shape)
        extra = [needle(make_key(), make_value(), kind) for _ in range(1200)]  # > 8K tokens of needles
        units = lambda n: extra[:n]  # noqa: E731
    intro = (f"Some special magic {kind} are hidden in the text below. Read it carefully and memorize them: "
             f"you will be asked about these {kind} afterwards.\n")
    names = ", ".join(k for k, _ in asked)
    question = f"What are all the special magic {kind} for {names} mentioned in the text above?"
    prefix = f"The special magic {kind} for {names} mentioned in the text above are"
    place = random.Random(seed + 1).random()  # one placement for every n the search tries

    def build(n: int) -> tuple[str, str]:
        return intro + _insert(units(n), needles, random.Random(place)) + "\n", question

    context, question = fit(count, length, build)
    answers = [v for _, vs in asked for v in vs]
    return context, question, prefix, answers


def _variable_tracking(seed: int, length: int, count: Counter, split: str) -> tuple[str, str, str, list[str]]:
    rng = random.Random(seed)
    chain: list[str] = []
    while len(chain) < 5:  # drawn in order (a set's order would follow the process's string hashing)
        name = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
        if name not in chain:
            chain.append(name)
    value = str(rng.randint(10_000, 99_999))
    statements = [f"VAR {chain[0]} = {value}. "] + [f"VAR {b} = VAR {a}. " for a, b in zip(chain, chain[1:])]
    intro = "Remember every variable assignment in the text below; you will be asked to follow them.\n"
    question = f"Find every variable that is assigned the value {value}, directly or through other variables."
    prefix = f"The variables assigned the value {value} are:"
    place = random.Random(seed + 1).random()

    def build(n: int) -> tuple[str, str]:
        units = [NOISE] * n
        slots = sorted(random.Random(place).randint(0, n) for _ in statements)  # in chain order
        out, at = [], 0
        for slot, text in zip(slots, statements):
            out += units[at:slot] + [text]
            at = slot
        return intro + " ".join(out + units[at:]) + "\n", question

    context, question = fit(count, length, build)
    return context, question, prefix, chain


def _common_words(seed: int, length: int, count: Counter, split: str) -> tuple[str, str, str, list[str]]:
    rng = random.Random(seed)
    vocabulary = sorted({w.lower() for p in essay_paragraphs(split) for w in re.findall(r"[A-Za-z]{4,10}", p)})
    words = rng.sample(vocabulary, len(vocabulary))
    common, rare = words[:10], words[10:]
    intro = "Below is a numbered list of words. Some of them appear many more times than the others.\n"
    question = "What are the 10 most common words in the list above?"
    prefix = "The 10 most common words in the list are:"
    order = random.Random(seed + 1).random()

    def build(n: int) -> tuple[str, str]:
        # n rare words appear 3 times each and the 10 common ones 30 times (RULER's setting), fewer in
        # a short context but always more often than any rare word.
        times = max(4, min(30, n // 2))
        listed = common * times + rare[: min(n, len(rare))] * 3
        random.Random(order).shuffle(listed)
        return intro + " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed)) + "\n", question

    context, question = fit(count, length, build)
    return context, question, prefix, common


def _frequent_words(seed: int, length: int, count: Counter, split: str) -> tuple[str, str, str, list[str]]:
    rng = random.Random(seed)
    coded = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6)) for _ in range(60)]
    intro = ("Read the coded text below and find the three words that appear most often in it. "
             "The words are made up; only how often they appear matters.\n")
    question = "What are the three most frequently appearing coded words in the text above?"
    prefix = "The three most frequent coded words are:"
    draw = random.Random(seed + 1).random()

    def build(n: int) -> tuple[str, str]:
        # Zipf's law with exponent 2 (RULER's alpha): word i drawn with weight 1 / (i + 1)^2.
        r = random.Random(draw)
        text = r.choices(coded, weights=[1.0 / (i + 1) ** 2 for i in range(len(coded))], k=n)
        return intro + " ".join(text) + "\n", question

    context, question = fit(count, length, build)
    return context, question, prefix, coded[:3]


TASKS: dict[str, tuple[Callable, int]] = {
    # name: (generator, answer tokens)
    "niah_single_1": (lambda s, n, c, sp: _niah(s, n, c, sp, haystack="noise", key_kind="word", value_kind="number"), 16),
    "niah_single_2": (lambda s, n, c, sp: _niah(s, n, c, sp, haystack="essay", key_kind="word", value_kind="number"), 16),
    "niah_single_3": (lambda s, n, c, sp: _niah(s, n, c, sp, haystack="essay", key_kind="word", value_kind="uuid"), 32),
    "niah_multikey_1": (lambda s, n, c, sp: _niah(s, n, c, sp, haystack="essay", key_kind="word", value_kind="number",
                                                  keys=4), 16),
    "niah_multikey_2": (lambda s, n, c, sp: _niah(s, n, c, sp, haystack="needle", key_kind="word",
                                                  value_kind="number"), 16),
    "niah_multikey_3": (lambda s, n, c, sp: _niah(s, n, c, sp, haystack="needle", key_kind="uuid",
                                                  value_kind="uuid"), 32),
    "niah_multivalue": (lambda s, n, c, sp: _niah(s, n, c, sp, haystack="essay", key_kind="word", value_kind="number",
                                                  values=4), 48),
    "niah_multiquery": (lambda s, n, c, sp: _niah(s, n, c, sp, haystack="essay", key_kind="word", value_kind="number",
                                                  keys=4, queries=4), 48),
    "vt": (_variable_tracking, 24),
    "cwe": (_common_words, 48),
    "fwe": (_frequent_words, 24),
}


def generate(task: str, seed: int, length: int, count: Counter, split: str) -> Sample:
    if task not in TASKS:
        raise SystemExit(f"ruler: unknown task {task!r} ({', '.join(TASKS)})")
    make, tokens = TASKS[task]
    # Each task its own random stream for a seed (a string seed is hashed the same way by every Python).
    stream = random.Random(f"{task}/{seed}/{length}").getrandbits(63)
    context, question, prefix, answers = make(stream, length, count, split)
    return Sample(task, seed, length, context, question, prefix, answers, tokens)


def string_match_all(prediction: str, answers: list[str]) -> float:
    """RULER's score of a sample: the share of its answers found in the prediction (case-insensitive)."""
    low = prediction.lower()
    return sum(a.lower() in low for a in answers) / len(answers)
