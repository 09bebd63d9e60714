#!/usr/bin/env python3
"""Applies the base study's rule (RULE.md beside this file) to its dev results and prints
the ranking: passkey hits (dev templates), NLL score (mean over keep 0.1 and 0.2 of the
median nll_ratio over the dev units), mean attention error, and the choice.

  choose.py --nll NLL.json --passkey PK.json [PK2.json ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from typing import Dict, List, Tuple, Union

RATIOS = (0.1, 0.2)
TIE = 0.002


def load(path: str) -> List[Dict]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)["records"]


def write_choice(path: str, doc: Dict) -> None:
    """A study's ranking and choice as JSON (the file its results section is rendered from)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def passkey_hits(paths: List[str]) -> Tuple[Dict[Tuple[str, float], int], Dict[Tuple[str, float], int]]:
    """(label, ratio) -> hits and trials over every dev template run."""
    hits: Dict[Tuple[str, float], int] = defaultdict(int)
    trials: Dict[Tuple[str, float], int] = defaultdict(int)
    for p in paths:
        for r in load(p):
            if r.get("metric") != "passkey_hits" or r.get("split", "dev") != "dev":
                continue
            hits[(r["label"], r["keep_ratio"])] += int(r["value"])
            trials[(r["label"], r["keep_ratio"])] += int(r.get("trials", 5))
    return hits, trials


def nll_scores(
    paths: Union[str, List[str]], ratios: Tuple[float, ...] = RATIOS
) -> Tuple[Dict[str, float], Dict[str, float], Dict[Tuple[str, float], float]]:
    """label -> NLL score (the mean over `ratios` of the median nll_ratio), label -> mean attention error,
    (label, ratio) -> median nll_ratio; over one study file or several (rows run apart on the same units)."""
    nll: Dict[Tuple[str, float], List[float]] = defaultdict(list)
    attn: Dict[str, List[float]] = defaultdict(list)
    for r in [r for path in ([paths] if isinstance(paths, str) else paths) for r in load(path)]:
        if r.get("split") != "dev" or r["keep_ratio"] not in ratios:
            continue
        if r["metric"] == "nll_ratio":
            nll[(r["label"], r["keep_ratio"])].append(r["value"])
        elif r["metric"] == "attn_rel_err":
            attn[r["label"]].append(r["value"])
    medians = {k: statistics.median(v) for k, v in nll.items()}
    labels = {k[0] for k in medians}
    score = {l: statistics.mean(medians[(l, r)] for r in ratios) for l in labels if all((l, r) in medians for r in ratios)}
    return score, {l: statistics.mean(v) for l, v in attn.items()}, medians


def default_capable(label: str, rows: Dict[str, Dict]) -> bool:
    """A FlashCache row a default can hold: per-head selection, no de-rotation (needs the model's RoPE)."""
    policy, options = rows[label]
    return (policy == "flashcache" and not options.get("rope_theta") and
            options.get("keep_set", "per_head") == "per_head")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nll", required=True)
    ap.add_argument("--passkey", nargs="+", required=True)
    ap.add_argument("--rows", default="bench/quality/study/base_rows.json")
    args = ap.parse_args(argv)
    with open(args.rows, encoding="utf-8") as f:
        rows = {label: (policy, options) for label, policy, options in json.load(f)}
    hits, trials = passkey_hits(args.passkey)
    score, attn, medians = nll_scores(args.nll)

    def rate(label: str, r: float) -> float:
        return hits[(label, r)] / trials[(label, r)] if trials[(label, r)] else 0.0

    print(f"{'row':34} " + " ".join(f"pk@{r:g}" for r in RATIOS) + "  " +
          " ".join(f"nll@{r:g}" for r in RATIOS) + "   score   attn")
    for label in rows:
        if label not in score:
            continue
        pk = " ".join(f"{hits[(label, r)]:2d}/{trials[(label, r)]:<2d}" for r in RATIOS)
        nl = " ".join(f"{medians[(label, r)]:.4f}" for r in RATIOS)
        print(f"{label:34} {pk}  {nl}  {score[label]:.4f}  {attn.get(label, float('nan')):.4f}")

    capable = [l for l in rows if l in score and default_capable(l, rows)]
    eligible = [l for l in capable if rate(l, 0.1) >= 0.8 and rate(l, 0.2) >= 0.95]
    step1 = "hit rate >= 0.8 at keep 0.1 and >= 0.95 at keep 0.2"
    if not eligible:
        total = {l: hits[(l, 0.1)] + hits[(l, 0.2)] for l in capable}
        best = max(total.values())
        eligible = [l for l in capable if total[l] >= best - 2]
        step1 = f"none reached the rates; within 2 hits of the best ({best})"
    print(f"\nstep 1 ({step1}): {', '.join(eligible)}")
    low = min(score[l] for l in eligible)
    tied = [l for l in eligible if score[l] <= low + TIE]
    tied.sort(key=lambda l: (-(hits[(l, 0.1)] + hits[(l, 0.2)]), attn.get(l, float("inf"))))
    print(f"step 2 (lowest NLL score {low:.4f}, ties within {TIE}): {', '.join(tied)}")
    print(f"choice: {tied[0]}")

    seq = [l for l in rows if l.startswith("default-seq-") and l in score]
    if seq:
        low = min(score[l] for l in seq)
        tied = sorted((l for l in seq if score[l] <= low + TIE), key=lambda l: -(hits[(l, 0.1)] + hits[(l, 0.2)]))
        print(f"shared keep-set combine rule: {tied[0]} (score {score[tied[0]]:.4f}; tied: {', '.join(tied)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
