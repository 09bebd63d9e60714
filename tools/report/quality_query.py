#!/usr/bin/env python3
"""The query study's RESULTS.md section: its dev ranking and choice (both stages), then the
held-out run made once with the choice.

    render_results(choice_doc) -> str   make_results.py's entry, given quality_long_query_choice.json
                                        (written by bench/quality/study/choose_query.py --json); the
                                        held-out files beside it are read when present

Nothing of the rule is repeated here: bench/quality/study/QUERY_RULE.md.
"""
from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(ROOT, "bench", "results")
HELDOUT_PASSKEY = os.path.join(RESULTS, "quality_long_query_heldout.json")
HELDOUT_NLL = os.path.join(RESULTS, "quality_long_query_nll_heldout.json")
RATIOS = (0.1, 0.2)


def _load(path: str) -> Dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.4f}"


def render_dev(c: Dict) -> List[str]:
    out = ["### Dev: both stages (rule applied by `choose_query.py`)", "",
           "| row | keys @0.1 | keys @0.2 | median NLL ratio @0.1 | @0.2 | NLL score | attn. error | eligible |",
           "|---|---|---|---|---|---|---|---|"]
    for label in c["order"]:
        hits = [c["hits_by_ratio"].get(f"{label}@{r:g}") for r in RATIOS]
        trials = [c["trials"].get(f"{label}@{r:g}") for r in RATIOS]
        med = [c["median_nll_ratio"].get(f"{label}@{r:g}") for r in RATIOS]
        mark = "**chosen**" if label == c["choice"] else ("yes" if label in c["eligible"] else "")
        out.append(f"| `{label}` | {hits[0]}/{trials[0]} | {hits[1]}/{trials[1]} | {_fmt(med[0])} | {_fmt(med[1])} | "
                   f"{_fmt(c['score'].get(label))} | {_fmt(c['attn'].get(label))} | {mark} |")
    out += ["", f"Step 1: candidates within 2 of the best candidate's {c['best_hits']} dev keys (keep 0.1 plus 0.2). "
            f"Step 2: the lowest NLL score, {c['nll_low']:.4f}, ties within 0.002: {', '.join(c['tied'])}. "
            f"Choice: `{c['choice']}` ({c['hits'][c['choice']]} dev keys; `default` {c['hits'].get('default')}).", ""]
    return out


def render_heldout() -> List[str]:
    out: List[str] = []
    if os.path.exists(HELDOUT_PASSKEY):
        doc = _load(HELDOUT_PASSKEY)
        recs = [r for r in doc["records"] if r["metric"] == "passkey_hits"]
        labels: List[str] = []
        for r in recs:
            if r["label"] not in labels:
                labels.append(r["label"])
        templates: List[str] = []
        for r in recs:
            if r["template"] not in templates:
                templates.append(r["template"])
        hits = defaultdict(int)
        by_t = defaultdict(int)
        for r in recs:
            hits[(r["label"], r["keep_ratio"])] += int(r["value"])
            by_t[(r["label"], r["keep_ratio"], r["template"])] += int(r["value"])
        total = 5 * len(templates)
        skipped = [n for n, t in doc["header"]["passkey"]["templates"].items() if t.get("skipped")]
        out += ["### Held-out passkeys (run once, with the choice made)", "",
                f"`{doc['header']['how']}` ({doc['header']['when']}). {len(templates)} templates at "
                f"{', '.join(str(x) for x in doc['header']['lengths'])} tokens"
                + (f"; left out (the full cache finds fewer than 4 of 5): {', '.join(skipped)}" if skipped else "")
                + ".", "",
                "| row | " + " | ".join(f"{t} @0.1 / @0.2" for t in templates) + " | all @0.1 | all @0.2 |",
                "|---|" + "---|" * (len(templates) + 2)]
        for label in labels:
            if label == "full":
                cells = [f"{by_t[(label, 1.0, t)]}" for t in templates]
                out.append("| full cache | " + " | ".join(cells) + f" | {hits[(label, 1.0)]}/{total} | |")
                continue
            cells = [f"{by_t[(label, 0.1, t)]} / {by_t[(label, 0.2, t)]}" for t in templates]
            out.append(f"| `{label}` | " + " | ".join(cells) + f" | {hits[(label, 0.1)]}/{total} | "
                       f"{hits[(label, 0.2)]}/{total} |")
        out.append("")
    if os.path.exists(HELDOUT_NLL):
        doc = _load(HELDOUT_NLL)
        vals = defaultdict(list)
        labels = []
        for r in doc["records"]:
            if r["metric"] == "nll_ratio":
                vals[(r["label"], r["keep_ratio"])].append(r["value"])
                if r["label"] not in labels:
                    labels.append(r["label"])
        units = len(vals[(labels[0], RATIOS[0])]) if labels else 0
        out += ["### Held-out NLL (run once, with the choice made)", "",
                f"`{doc['header']['how']}` ({doc['header']['when']}). Median `nll_ratio` over {units} units "
                f"(held-out texts x P = {', '.join(str(x) for x in doc['header']['lengths'])}).", "",
                "| row | @0.1 | @0.2 |", "|---|---|---|"]
        for label in labels:
            out.append(f"| `{label}` | " + " | ".join(
                _fmt(statistics.median(vals[(label, r)])) if vals[(label, r)] else "-" for r in RATIOS) + " |")
        out.append("")
    return out


def render_results(choice: Dict) -> str:
    lines = ["## Query study: what the prompt's queries say (SmolLM2-135M, 30 layers)", "",
             "Rule and rows: [`bench/quality/study/QUERY_RULE.md`](quality/study/QUERY_RULE.md), "
             "`query_rows.json`, `query_rows_2.json`, committed before each stage's run. Dev passkeys at 1,024 tokens "
             "(the dev templates of `passkey_split.json`), NLL of the next 256 tokens on the 4 dev texts at "
             "P = 1,024 and 2,048; every row but `paper` has the default protected set. Keep 0.1 and 0.2.", ""]
    lines += render_dev(choice)
    lines += render_heldout()
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_results(_load(os.path.join(RESULTS, "quality_long_query_choice.json"))))
