#!/usr/bin/env python3
"""Applies MEAN_RULE.md (beside this file): does mean_weight 0.75 hold on the library's own dev passkeys
and NLL, per layer and with one keep-set per sequence? Prints each pair and the verdict; with --json,
writes them (the file RESULTS.md's section is rendered from).

  choose_mean.py --nll NLL.json --passkey PK.json [PK2.json ...] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import sys

from choose import RATIOS, TIE, nll_scores, passkey_hits, write_choice

HIT_TOLERANCE = 2  # the base study's retrieval tolerance (RULE.md step 1)
PAIRS = (("per layer", "mw0", "mw0.75"), ("per sequence", "mw0-seq", "mw0.75-seq"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nll", required=True)
    ap.add_argument("--passkey", nargs="+", required=True)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    hits, trials = passkey_hits(args.passkey)
    score, attn, medians = nll_scores(args.nll)
    pairs, holds = [], True
    for name, before, after in PAIRS:
        hit = {label: sum(hits[(label, r)] for r in RATIOS) for label in (before, after)}
        trial = sum(trials[(before, r)] for r in RATIOS)
        keys_ok = hit[after] >= hit[before] - HIT_TOLERANCE
        nll_ok = score[after] <= score[before] + TIE
        holds &= keys_ok and nll_ok
        pairs.append({"keep_set": name, "rows": [before, after], "hits": [hit[before], hit[after]], "trials": trial,
                      "hits_by_ratio": {f"{r:g}": [hits[(before, r)], hits[(after, r)]] for r in RATIOS},
                      "nll_score": [score[before], score[after]],
                      "nll_by_ratio": {f"{r:g}": [medians[(before, r)], medians[(after, r)]] for r in RATIOS},
                      "attn_rel_err": [attn.get(before), attn.get(after)], "keys_hold": keys_ok, "nll_holds": nll_ok})
        print(f"{name}: dev keys {hit[before]}/{trial} -> {hit[after]}/{trial} "
              f"({'holds' if keys_ok else 'fails'}: at most {HIT_TOLERANCE} fewer); NLL score "
              f"{score[before]:.4f} -> {score[after]:.4f} ({'holds' if nll_ok else 'fails'}: at most {TIE} above)")
    verdict = "mean_weight 0.75 becomes the default" if holds else "the default stays 0"
    print(f"verdict: {verdict}")
    if args.json:
        write_choice(args.json, {"rule": "bench/quality/study/MEAN_RULE.md", "pairs": pairs, "holds": holds,
                                 "verdict": verdict})
    return 0


if __name__ == "__main__":
    sys.exit(main())
