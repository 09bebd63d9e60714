#!/usr/bin/env python3
"""Applies MEAN_RULE.md (beside this file): does mean_weight 0.75 hold on the library's own dev passkeys
and NLL, per layer and with one keep-set per sequence? Prints each pair and the verdict; with --json,
writes them (the file RESULTS.md's section is rendered from). With --ratios 0.5 --rule FADE_RULE.md it
applies FADE_RULE.md's check instead: the same pairs at the light keep ratio where the fade's weight is in full
(--weight 1.0: its addendum's pairs, the rows mw1 and mw1-seq against mw0 and mw0-seq). With --rule
ROUND18_RULE.md --rows default r18 it pairs those rows and their -seq forms instead.

  choose_mean.py --nll NLL.json --passkey PK.json [PK2.json ...] [--json OUT.json]
  choose_mean.py --ratios 0.5 --rule FADE_RULE.md --nll NLL.json --passkey PK.json [...] [--json OUT.json]
  choose_mean.py --ratios 0.5 --rule FADE_RULE.md --weight 1.0 --nll NLL.json NLL1.json --passkey PK.json [...]
  choose_mean.py --ratios 0.1 0.2 0.5 --rule ROUND18_RULE.md --rows default r18 --nll NLL.json --passkey PK.json [...]
"""

from __future__ import annotations

import argparse
import sys

from choose import RATIOS, TIE, nll_scores, passkey_hits, write_choice

HIT_TOLERANCE = 2  # the base study's retrieval tolerance (RULE.md step 1)


def pairs_of(before: str, after: str) -> tuple[tuple[str, str, str], ...]:
    """(keep-set, the current row, the candidate's row): each row per layer and its `-seq` form per sequence."""
    return (("per layer", before, after), ("per sequence", f"{before}-seq", f"{after}-seq"))

RULES = {  # rule file -> (verdict when both pairs hold, verdict otherwise)
    "MEAN_RULE.md": ("mean_weight 0.75 becomes the default", "the default stays 0"),
    "FADE_RULE.md": (
        "the fade holds at keep 0.5 (the default if RULER's round chose it)",
        "the default stays mean_weight 0",
    ),
    "ROUND18_RULE.md": (
        "the candidate holds on the base study's dev data (held-out report next)",
        "the default stays as it is",
    ),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nll", nargs="+", required=True, help="study files (rows run apart on the same units)")
    ap.add_argument("--passkey", nargs="+", required=True)
    ap.add_argument("--json", default=None)
    ap.add_argument("--ratios", type=float, nargs="+", default=list(RATIOS), help="keep ratios (MEAN_RULE.md's)")
    ap.add_argument("--rule", default="MEAN_RULE.md", choices=RULES, help="the rule file applied (its verdict)")
    ap.add_argument("--weight", type=float, default=0.75, help="the candidate's mean_weight (its rows' names)")
    ap.add_argument("--rows", nargs=2, metavar=("CURRENT", "CANDIDATE"), default=None,
                    help="the rows paired instead of mw0 and mw<weight> (and their -seq forms)")
    args = ap.parse_args(argv)
    ratios = tuple(args.ratios)
    hits, trials = passkey_hits(args.passkey)
    score, attn, medians = nll_scores(args.nll, ratios)
    pairs, holds = [], True
    rows = args.rows or ("mw0", f"mw{args.weight:g}")
    for name, before, after in pairs_of(*rows):
        hit = {label: sum(hits[(label, r)] for r in ratios) for label in (before, after)}
        trial = sum(trials[(before, r)] for r in ratios)
        keys_ok = hit[after] >= hit[before] - HIT_TOLERANCE
        nll_ok = score[after] <= score[before] + TIE
        holds &= keys_ok and nll_ok
        pairs.append({"keep_set": name, "rows": [before, after], "hits": [hit[before], hit[after]], "trials": trial,
                      "hits_by_ratio": {f"{r:g}": [hits[(before, r)], hits[(after, r)]] for r in ratios},
                      "nll_score": [score[before], score[after]],
                      "nll_by_ratio": {f"{r:g}": [medians[(before, r)], medians[(after, r)]] for r in ratios},
                      "attn_rel_err": [attn.get(before), attn.get(after)], "keys_hold": keys_ok, "nll_holds": nll_ok})
        print(f"{name}: dev keys {hit[before]}/{trial} -> {hit[after]}/{trial} "
              f"({'holds' if keys_ok else 'fails'}: at most {HIT_TOLERANCE} fewer); NLL score "
              f"{score[before]:.4f} -> {score[after]:.4f} ({'holds' if nll_ok else 'fails'}: at most {TIE} above)")
    verdict = RULES[args.rule][0 if holds else 1]
    print(f"verdict: {verdict}")
    if args.json:
        write_choice(args.json, {"rule": f"bench/quality/study/{args.rule}", "ratios": list(ratios),
                                 "weight": args.weight, "rows": list(rows), "pairs": pairs,
                                 "holds": holds, "verdict": verdict})
    return 0


if __name__ == "__main__":
    sys.exit(main())
