"""The RULER-style generator: lengths, answers present and unambiguous, determinism, the split kept apart.
Runs without a model (a whitespace token counter stands in for the tokenizer)."""

import collections
import itertools
import os
import re

import pytest
import tasks  # this folder: sys.path[0] for a script, pytest's rootdir insertion for a test


def count(text):
    return len(text.split())


def have_haystack():
    return all(os.path.exists(f["path"]) for f in tasks.load_split()["haystack"]["files"])


pytestmark = pytest.mark.skipif(not have_haystack(), reason="doc-debian or python3.11-doc is not installed")


@pytest.mark.parametrize("name", list(tasks.TASKS))
@pytest.mark.parametrize("length", [1024, 4096])
def test_a_sample_fits_its_length_and_holds_its_answers(name, length):
    s = tasks.generate(name, 3, length, count, "dev")
    used = count(s.context + s.question)
    assert 0.85 * length <= used <= length, f"{name}: {used} of {length}"
    assert s.answers and all(a in s.context for a in s.answers if name not in ("cwe", "fwe"))
    assert s == tasks.generate(name, 3, length, count, "dev")  # one seed, one sample
    assert s.context != tasks.generate(name, 4, length, count, "dev").context


@pytest.mark.parametrize("length", [1024, 4096])
def test_aggregation_answers_are_strictly_the_most_frequent(length):
    cwe = tasks.generate("cwe", 1, length, count, "dev")
    listed = collections.Counter(re.findall(r"\d+\. (\w+)", cwe.context))
    top = sorted(listed.values(), reverse=True)
    assert {w for w, _ in listed.most_common(10)} == set(cwe.answers) and top[9] > top[10]
    fwe = tasks.generate("fwe", 1, length, count, "dev")
    words = collections.Counter(fwe.context.split("\n")[1].split())
    ranked = words.most_common(4)
    assert [w for w, _ in ranked[:3]] == fwe.answers and ranked[2][1] > ranked[3][1]


def test_variable_tracking_states_its_chain_in_order():
    s = tasks.generate("vt", 2, 2048, count, "dev")
    at = [s.context.index(f"VAR {name} =") for name in s.answers]
    assert at == sorted(at) and f"= {s.question.split('value ')[1].split(',')[0]}." in s.context


def test_a_seed_gives_one_sample_in_every_process():
    """Python hashes strings differently in each process (PYTHONHASHSEED): nothing may follow a set's order."""
    import json
    import subprocess
    import sys

    code = ("import json, tasks; print(json.dumps([tasks.generate(t, 5, 1024, lambda x: len(x.split()), 'dev')"
            ".context for t in tasks.TASKS]))")
    here = os.path.dirname(os.path.abspath(__file__))
    runs = [subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(h)}).stdout for h in (1, 2)]
    assert json.loads(runs[0]) == json.loads(runs[1])


def test_needles_of_multikey_are_distinct_and_one_is_asked():
    s = tasks.generate("niah_multikey_3", 0, 2048, count, "dev")
    keys = re.findall(r"magic uuids for ([0-9a-f-]{36}) is", s.context)
    assert len(keys) == len(set(keys)) > 20 and s.question.count("-") == 4


def test_the_splits_haystacks_share_no_paragraph():
    splits = {name: set(tasks.essay_paragraphs(name)) for name in tasks.load_split()["seeds"]}
    assert set(splits) == {"dev", "dev2", "heldout"} and all(splits.values())
    for a, b in itertools.combinations(splits, 2):
        assert not splits[a] & splits[b], (a, b)


def test_the_splits_seeds_are_disjoint():
    seeds = tasks.load_split()["seeds"]
    for a, b in itertools.combinations(seeds, 2):
        assert not set(seeds[a]) & set(seeds[b]), (a, b)


def test_string_match_all_is_the_share_of_answers_found():
    assert tasks.string_match_all("the values are 123 and 456", ["123", "456"]) == 1.0
    assert tasks.string_match_all("ABC-def", ["abc-DEF", "xyz"]) == 0.5
