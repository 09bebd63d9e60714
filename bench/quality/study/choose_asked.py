#!/usr/bin/env python3
"""Applies the asked-later study's rule (ASKED_RULE.md beside this file) to its dev results
and prints the totals and the choice: dev passkey hits summed over keep ratios and templates.

  choose_asked.py bench/results/quality_long_asked_dev.json [--json CHOICE.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from typing import Dict

# The base study's writer, beside this file (a script's own folder is sys.path[0]).
from choose import write_choice


def totals(doc: Dict) -> Dict[str, int]:
    if doc["header"]["split"] != "dev":
        raise SystemExit("choose_asked: the choice is made on dev results only")
    out: Dict[str, int] = collections.Counter()
    for r in doc["records"]:
        if r["metric"] == "passkey_hits":
            out[r["label"]] += r["value"]
    return dict(out)


def choose(hits: Dict[str, int]) -> Dict:
    base = [l for l in hits if re.fullmatch(r"recall-\d+-b\d+", l)]
    if not base:
        raise SystemExit("choose_asked: no recall-R-bB rows in the dev results (run asked_eval.py --study)")

    def size(label):
        r, b = map(int, re.fullmatch(r"recall-(\d+)-b(\d+)", label).groups())
        return r, b

    # Step 1: the most hits; ties to the smaller R, then the larger block.
    base.sort(key=lambda l: (-hits[l], size(l)[0], -size(l)[1]))
    chosen, steps = base[0], []
    # Step 2, in this order: -last and -digest replace at equal hits (cheaper), -shared only with more.
    suffixes = ""
    for suffix, needs_more in (("-last", False), ("-digest", False), ("-shared", True)):
        variant = base[0] + suffix
        if variant not in hits:
            continue
        wins = hits[variant] > hits[base[0]] if needs_more else hits[variant] >= hits[base[0]]
        steps.append({"variant": variant, "hits": hits[variant], "against": hits[base[0]], "taken": wins})
        if wins:
            suffixes += suffix
    chosen = base[0] + suffixes
    return {"step1": base[0], "step1_ranking": [(l, hits[l]) for l in base], "step2": steps, "choice": chosen,
            "hits": hits}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dev")
    ap.add_argument("--json", default=None, help="also write the totals and the choice here")
    args = ap.parse_args(argv)
    with open(args.dev, encoding="utf-8") as f:
        doc = json.load(f)
    c = choose(totals(doc))
    for label, n in sorted(c["hits"].items(), key=lambda kv: -kv[1]):
        print(f"{n:3d}  {label}")
    print(f"step 1: {c['step1']}")
    for s in c["step2"]:
        print(f"step 2: {s['variant']} {s['hits']} against {s['against']}: {'taken' if s['taken'] else 'not taken'}")
    print(f"choice: {c['choice']}")
    if args.json:
        c["dev_file"] = args.dev
        c["dev_header"] = {k: doc["header"][k] for k in ("how", "when", "git", "templates", "templates_run")}
        write_choice(args.json, c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
