"""Applies split.json's rule to the dev runs of candidates.json: which candidate, if any, replaces its row's
current setting. Prints the comparison and the decision; chooses nothing by hand.

    python3 bench/ruler/choose.py bench/results/ruler/smollm2_agnostic_dev.jsonl
    python3 bench/ruler/choose.py bench/results/ruler/smollm2_agnostic_dev_round2.jsonl bench/ruler/candidates_2.json
    python3 bench/ruler/choose.py bench/results/ruler/smollm2_agnostic_dev_round4.jsonl bench/ruler/candidates_4.json
    python3 bench/ruler/choose.py bench/results/ruler/smollm2_agnostic_dev_round11_seeds{6,8}.jsonl \
        bench/ruler/candidates_11.json                      # a round run as parallel halves: every file read
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
RATIOS = (0.5, 0.75, 0.875)  # split.json's rule


@dataclass
class Verdict:
    """One candidate beside its row's current setting, on the runs both have."""

    candidate: str
    base: str
    mean: float  # the candidate's, over the common runs
    base_mean: float
    gain: float
    step: float  # one sample's worth, in points of the mean
    mk3_gain: float
    samples: int
    runs: int
    time_ratio: float  # the candidate's median time over the row's (prefill and compression, recall)
    cost_rule: bool
    wins: bool


def rule_ratios(listed: dict) -> tuple[float, ...]:
    """The ratios a candidate list is judged on: its own (candidates_6.json: the query-aware goal is at every
    ratio), else split.json's rule's."""
    return tuple(listed.get("ratios", RATIOS))


def compare(paths: str | list[str], candidates_path: str) -> tuple[list[Verdict], list[str]]:
    """The verdicts on the candidates of a dev round's file (or files: a round run as parallel halves) by the
    rule of their list, and those not run yet."""
    with open(candidates_path) as f:
        listed = json.load(f)
    ratios = rule_ratios(listed)
    scores = defaultdict(dict)  # row -> (task, seed, length, ratio) -> score
    seconds = defaultdict(dict)  # the same -> prefill and compression plus what the recall added
    for path in [paths] if isinstance(paths, str) else paths:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if not r.get("header") and r["ratio"] in ratios:
                    key = (r["task"], r["seed"], r["length"], r["ratio"])
                    scores[r["row"]][key] = r["score"]
                    seconds[r["row"]][key] = r["prefill_s"] + r["recall_s"]
    # "cost" (candidates_4.json): a change that buys time replaces the setting when it loses less than
    # one sample's worth, keeps niah_multikey_3 and is faster (median over the same runs).
    cost_rule = listed.get("rule") == "cost"
    verdicts, missing = [], []
    for cand in listed["candidates"]:
        base = cand.split("@")[0]
        if cand not in scores or base not in scores:
            missing.append(cand)
            continue
        common = sorted(set(scores[cand]) & set(scores[base]))
        samples = {k[:3] for k in common}
        tasks = {k[0] for k in common}
        per_task = max(1, len(samples) // max(1, len(tasks)))
        step = 100.0 / per_task / len(tasks)
        mean = lambda row, keys: sum(scores[row][k] for k in keys) / len(keys)  # noqa: E731
        mk3 = [k for k in common if k[0] == "niah_multikey_3"]
        gain = mean(cand, common) - mean(base, common)
        mk3_gain = mean(cand, mk3) - mean(base, mk3) if mk3 else 0.0
        ratio = statistics.median(seconds[cand][k] for k in common) / statistics.median(
            seconds[base][k] for k in common)
        # "At least one sample's worth": a gain of exactly one sample (k runs of the mean's k x tasks) is
        # computed in floating point, so equality is taken within rounding.
        if cost_rule:
            wins = gain > -step + 1e-9 and mk3_gain >= -1e-9 and ratio < 1
        else:
            wins = gain >= step - 1e-9 and mk3_gain >= -1e-9
        verdicts.append(Verdict(cand, base, mean(cand, common), mean(base, common), gain, step, mk3_gain,
                                len(samples), len(common), ratio, cost_rule, wins))
    return verdicts, missing


def choices(verdicts: list[Verdict]) -> dict[str, Verdict]:
    """Per row, the winning candidate with the largest gain."""
    chosen: dict[str, Verdict] = {}
    for v in verdicts:
        if v.wins and (v.base not in chosen or v.gain > chosen[v.base].gain):
            chosen[v.base] = v
    return chosen


def main(args: list[str]) -> int:
    """choose.py RUNS.jsonl... [CANDIDATES.json] (default candidates.json)."""
    listed = [a for a in args if a.endswith(".json")]
    paths = [a for a in args if not a.endswith(".json")]
    if not paths or len(listed) > 1:
        print("usage: choose.py RUNS.jsonl... [CANDIDATES.json]", file=sys.stderr)
        return 2
    verdicts, missing = compare(paths, listed[0] if listed else os.path.join(HERE, "candidates.json"))
    for cand in missing:
        print(f"{cand}: not run yet")
    for v in verdicts:
        need = (f"more than {-v.step:.2f}; time {v.time_ratio:.3f} of {v.base}'s, needs below 1" if v.cost_rule
                else f"needs {v.step:.2f}")
        print(f"{v.candidate}: mean {v.mean:.1f} vs {v.base} {v.base_mean:.1f} (gain {v.gain:+.2f}, {need}); "
              f"niah_multikey_3 {v.mk3_gain:+.1f}; {v.samples} samples -> "
              f"{'REPLACES' if v.wins else 'keeps'} the current setting")
    chosen = choices(verdicts)
    for base, v in sorted(chosen.items()):
        print(f"choice: {base} -> {v.candidate} ({v.gain:+.1f} points on dev)")
    if not chosen:
        print("choice: every row keeps its current setting")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
