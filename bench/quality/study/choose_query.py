#!/usr/bin/env python3
"""Applies the query study's rule (QUERY_RULE.md beside this file) to its dev results of both
stages and prints the ranking and the choice: passkey hits (dev templates), NLL score (mean over
keep 0.1 and 0.2 of the median nll_ratio over the dev units), mean attention error.

  choose_query.py --rows R1.json R2.json --nll N1.json N2.json --passkey P1.json P2.json
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List

# The base study's readers, beside this file (a script's own folder is sys.path[0]).
from choose import RATIOS, TIE, nll_scores, passkey_hits, write_choice


def is_candidate(label: str) -> bool:
    """A row the query-informed preset can be: a tail row with one keep-set per head."""
    return label.startswith("tail-") and not label.endswith("-seq")


def is_cheaper(label: str) -> bool:
    return "-stride8" in label or "-last256" in label


def choose(order: List[str], hits: Dict, score: Dict[str, float]) -> Dict:
    """Steps 1 and 2 of the rule over the candidates in `order` (the rows files' order)."""
    total = {l: hits[(l, 0.1)] + hits[(l, 0.2)] for l in order}
    candidates = [l for l in order if is_candidate(l) and l in score]
    best = max(total[l] for l in candidates)
    eligible = [l for l in candidates if total[l] >= best - 2]
    low = min(score[l] for l in eligible)
    tied = [l for l in eligible if score[l] <= low + TIE]
    tied.sort(key=lambda l: (-total[l], not is_cheaper(l), order.index(l)))
    return {"best_hits": best, "eligible": eligible, "nll_low": low, "tied": tied, "choice": tied[0],
            "hits": {l: total[l] for l in order}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", nargs="+", required=True)
    ap.add_argument("--nll", nargs="+", required=True)
    ap.add_argument("--passkey", nargs="+", required=True)
    ap.add_argument("--json", default=None, help="also write the ranking and choice here")
    args = ap.parse_args(argv)
    order: List[str] = []
    for path in args.rows:
        with open(path, encoding="utf-8") as f:
            order += [label for label, _, _ in json.load(f) if label not in order]
    # Rows both stages share (default, paper, h2o, snapkv) ran in each, on the same data: the
    # first run of a label counts.
    hits: Dict = {}
    trials: Dict = {}
    for path in args.passkey:
        h, t = passkey_hits([path])
        for key in h:
            if key not in hits:
                hits[key], trials[key] = h[key], t[key]
    score: Dict[str, float] = {}
    attn: Dict[str, float] = {}
    medians: Dict = {}
    for path in args.nll:
        s, a, m = nll_scores(path)
        for label in s:
            score.setdefault(label, s[label])
        for label in a:
            attn.setdefault(label, a[label])
        for key in m:
            medians.setdefault(key, m[key])
    order = [l for l in order if (l, 0.1) in hits]

    print(f"{'row':30} " + " ".join(f"pk@{r:g}" for r in RATIOS) + "  " +
          " ".join(f"nll@{r:g}" for r in RATIOS) + "   score   attn")
    for label in order:
        pk = " ".join(f"{hits.get((label, r), 0):2d}/{trials.get((label, r), 0):<2d}" for r in RATIOS)
        nl = " ".join(f"{medians.get((label, r), float('nan')):.4f}" for r in RATIOS)
        print(f"{label:30} {pk}  {nl}  {score.get(label, float('nan')):.4f}  {attn.get(label, float('nan')):.4f}")
    c = choose(order, hits, score)
    print(f"\nstep 1 (within 2 of the best candidate's {c['best_hits']} hits): {', '.join(c['eligible'])}")
    print(f"step 2 (lowest NLL score {c['nll_low']:.4f}, ties within {TIE}): {', '.join(c['tied'])}")
    print(f"choice: {c['choice']} ({c['hits'][c['choice']]} dev hits; default {c['hits'].get('default')})")
    if args.json:
        doc = dict(c, order=order, score=score, attn=attn,
                   trials={f"{l}@{r:g}": trials[(l, r)] for l in order for r in RATIOS},
                   hits_by_ratio={f"{l}@{r:g}": hits[(l, r)] for l in order for r in RATIOS},
                   median_nll_ratio={f"{l}@{r:g}": medians.get((l, r)) for l in order for r in RATIOS})
        write_choice(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
