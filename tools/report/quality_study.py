#!/usr/bin/env python3
"""The base study's RESULTS.md section ("Find the needle"): its dev ranking and its choice.

    render(paths) -> str      paths = {"nll": NLL study JSON, "passkey": [dev passkey JSON, ...],
                                       "rows": rows JSON (default bench/quality/study/base_rows.json)}
    default_paths() -> dict   the files under bench/results/ (None when the NLL study or choose.py is missing)
    render_results(doc) -> str  make_results.py's entry: render(default_paths())
    python3 tools/report/quality_study.py [--nll JSON] [--passkey JSON ...] [--rows JSON]

The ranking and the choice come from bench/quality/study/choose.py (loaded from its path), which
applies bench/quality/study/RULE.md; nothing of the rule is repeated here. The passkey files are
optional: without them the table shows the NLL side only and no choice is made (the rule ranks
retrieval first).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import math
import os
import sys
from typing import Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(ROOT, "bench", "results")
STUDY = os.path.join(ROOT, "bench", "quality", "study")
NLL_JSON = os.path.join(RESULTS, "quality_long_study_base.json")
PASSKEY_JSONS = [os.path.join(RESULTS, "quality_long_passkey_dev.json"),
                 os.path.join(RESULTS, "quality_long_passkey_dev_two.json")]
ROWS_JSON = os.path.join(STUDY, "base_rows.json")


def choose_module():
    """bench/quality/study/choose.py, imported from its path."""
    path = os.path.join(STUDY, "choose.py")
    spec = importlib.util.spec_from_file_location("flashcache_study_choose", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def default_paths() -> Optional[Dict]:
    if not os.path.exists(NLL_JSON) or not os.path.exists(os.path.join(STUDY, "choose.py")):
        return None
    return {"nll": NLL_JSON, "passkey": [p for p in PASSKEY_JSONS if os.path.exists(p)], "rows": ROWS_JSON}


def render_results(_doc=None) -> str:
    """make_results.py's entry: the files under bench/results/ (the loaded NLL doc is not needed,
    choose.py reads the files itself)."""
    paths = default_paths()
    return render(paths) if paths else ""


def _header(path: str) -> Dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f).get("header", {})


def _rel(path: str) -> str:
    path = os.path.abspath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def _fmt(x: Optional[float], fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def render(paths: Dict) -> str:
    nll_path = paths["nll"]
    pk_paths: List[str] = list(paths.get("passkey") or [])
    if isinstance(pk_paths, str):
        pk_paths = [pk_paths]
    rows_path = paths.get("rows") or ROWS_JSON
    choose = choose_module()
    with open(rows_path, encoding="utf-8") as f:
        rows = {label: (policy, options) for label, policy, options in json.load(f)}
    score, attn, medians = choose.nll_scores(nll_path)
    hits, trials = choose.passkey_hits(pk_paths)
    ratios = choose.RATIOS

    # The rule's own lines (steps, choice, shared keep-set combine rule), as choose.py prints them.
    choice_lines: List[str] = []
    chosen = None
    if pk_paths:
        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf):
                choose.main(["--nll", nll_path, "--passkey", *pk_paths, "--rows", rows_path])
            text = buf.getvalue()
            choice_lines = [l for l in text.split("\n\n", 1)[-1].splitlines() if l.strip()]
        except Exception as e:  # a partial study: show the table, say why there is no choice
            choice_lines = [f"choose.py could not apply the rule to these files ({type(e).__name__}: {e})"]
        for line in choice_lines:
            if line.startswith("choice: "):
                chosen = line[len("choice: "):].strip()

    h = _header(nll_path)
    out = ["## Base study: which frequency base finds the needle (dev data only)", "",
           "Rule, written before the first run: [`bench/quality/study/RULE.md`](quality/study/RULE.md) — "
           "retrieval first (dev passkey hit rate at keep 0.1 and 0.2), then the dev NLL score (mean over keep "
           "0.1 and 0.2 of the median `nll_ratio` over the dev text x length units). Applied by "
           "`bench/quality/study/choose.py`; rows: `bench/quality/study/base_rows.json`.", "",
           f"NLL: `{_rel(nll_path)}` (`{h.get('how', '?')}`, {h.get('when', '?')}, git "
           f"`{(h.get('git') or '?')[:10]}`; {h.get('seconds', 0) / 60:.0f} minutes)."]
    for p in pk_paths:
        ph = _header(p)
        info = ph.get("passkey", {}).get("templates", {})
        ran = [t for t, e in info.items() if e.get("length")]
        skipped = [t for t, e in info.items() if e.get("skipped")]
        out.append(f"Passkey: `{_rel(p)}` (`{ph.get('how', '?')}`, {ph.get('when', '?')}; templates "
                   f"{', '.join(ran) or 'none'}" + (f"; skipped {', '.join(skipped)}" if skipped else "") + ").")
    if not pk_paths:
        out.append("Passkey: no dev passkey results yet (`bench/results/quality_long_passkey_dev*.json`), so "
                   "no choice is made.")
    out += ["", "| row | can be default | " + " | ".join(f"passkey @{r:g}" for r in ratios) + " | " +
            " | ".join(f"median nll_ratio @{r:g}" for r in ratios) + " | score | mean attn err |",
            "|---|---|" + "---|" * (2 * len(ratios) + 2)]
    for label in rows:
        if label not in score:
            continue
        name = f"**{label}** (chosen)" if label == chosen else label
        capable = "yes" if choose.default_capable(label, rows) else "no"
        pk = [f"{hits[(label, r)]}/{trials[(label, r)]}" if trials.get((label, r)) else "-" for r in ratios]
        nl = [_fmt(medians.get((label, r)), "{:.4f}") for r in ratios]
        out.append(f"| {name} | {capable} | " + " | ".join(pk) + " | " + " | ".join(nl) +
                   f" | {score[label]:.4f} | {_fmt(attn.get(label), '{:.4f}')} |")
    missing = [l for l in rows if l not in score]
    out.append("")
    if missing:
        out += [f"Rows without NLL results at every keep ratio of the rule (left out): {', '.join(missing)}.", ""]
    if choice_lines:
        out += ["The rule's steps (choose.py):", ""] + [f"- {l}" for l in choice_lines] + [""]
    return "\n".join(out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nll", default=NLL_JSON)
    ap.add_argument("--passkey", nargs="*", default=None)
    ap.add_argument("--rows", default=ROWS_JSON)
    args = ap.parse_args(argv)
    pk = args.passkey if args.passkey is not None else [p for p in PASSKEY_JSONS if os.path.exists(p)]
    print(render({"nll": args.nll, "passkey": pk, "rows": args.rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())


MEAN_NLL = os.path.join(RESULTS, "quality_long_mean_nll_dev.json")
MEAN_PASSKEY = [os.path.join(RESULTS, "quality_long_mean_passkey_dev.json"),
                os.path.join(RESULTS, "quality_long_mean_passkey_dev_two.json")]
FADE_NLL = os.path.join(RESULTS, "quality_long_fade_nll_dev.json")
FADE_PASSKEY = [os.path.join(RESULTS, "quality_long_fade_passkey_dev.json"),
                os.path.join(RESULTS, "quality_long_fade_passkey_dev_two.json")]
FADE_ONE_NLL = os.path.join(RESULTS, "quality_long_fade_one_nll_dev.json")
FADE_ONE_PASSKEY = [os.path.join(RESULTS, "quality_long_fade_one_passkey_dev.json"),
                    os.path.join(RESULTS, "quality_long_fade_one_passkey_dev_two.json")]
ROUND18_NLL = os.path.join(RESULTS, "quality_long_round18_nll_dev.json")
ROUND18_PASSKEY = [os.path.join(RESULTS, "quality_long_round18_passkey_dev.json"),
                   os.path.join(RESULTS, "quality_long_round18_passkey_dev_two.json")]


def _render_pairs(doc: Dict, title: str, rule: str, runs: List[str]) -> str:
    """A choose_mean.py verdict: each pair (per layer, per sequence) at the doc's keep ratios, the runs it read."""
    ratios = doc.get("ratios", choose_module().RATIOS)
    out = [title, "", rule, ""]
    for p in runs:
        if os.path.exists(p):
            h = _header(p)
            out.append(f"- `{_rel(p)}`: `{h.get('how', '?')}` ({h.get('when', '?')}, git `{(h.get('git') or '?')[:10]}`).")
    out += ["", "| keep-set | row | " + " | ".join(f"passkey @{r:g}" for r in ratios) + " | passkeys | NLL score | "
            "mean attn err | holds |", "|---|---|" + "---|" * (len(ratios) + 4)]
    for pair in doc["pairs"]:
        for i, label in enumerate(pair["rows"]):
            pk = [f"{pair['hits_by_ratio'][f'{r:g}'][i]}" for r in ratios]
            held = "" if i == 0 else ("keys " + ("yes" if pair["keys_hold"] else "no") + ", NLL " +
                                      ("yes" if pair["nll_holds"] else "no"))
            out.append(f"| {pair['keep_set']} | {label} | " + " | ".join(pk) +
                       f" | {pair['hits'][i]}/{pair['trials']} | {pair['nll_score'][i]:.4f} | "
                       f"{_fmt(pair['attn_rel_err'][i], '{:.4f}')} | {held} |")
    out += ["", f"Verdict: {doc['verdict']}.", ""]
    return "\n".join(out)


def render_mean(doc: Dict) -> str:
    """RULER's mean_weight 0.75 checked on the base study's dev data (study/MEAN_RULE.md), from
    quality_long_mean_choice.json (study/choose_mean.py) and the runs it read."""
    return _render_pairs(
        doc, "## RULER's mean_weight 0.75 on the library's own dev passkeys and NLL",
        "Rule, written before the run: [`bench/quality/study/MEAN_RULE.md`](quality/study/MEAN_RULE.md) — "
        "mean_weight 0.75 becomes the default only if, per layer and with one keep-set per sequence, its dev "
        "passkeys (keep 0.1 plus 0.2) are at most 2 below mean_weight 0's and its NLL score at most 0.002 above. "
        "Applied by `bench/quality/study/choose_mean.py`; rows: `bench/quality/study/mean_rows.json`.",
        [MEAN_NLL] + MEAN_PASSKEY)


def render_fade(doc: Dict) -> str:
    """The budget-following weight's light end (keep 0.5, where its weight is 0.75 in full) on the base study's
    dev data (study/FADE_RULE.md), from quality_long_fade_choice.json."""
    return _render_pairs(
        doc, "## A mean_weight that follows the budget, at keep 0.5 on the library's own dev passkeys and NLL",
        "Rule, written before the run: [`bench/quality/study/FADE_RULE.md`](quality/study/FADE_RULE.md) — "
        "`mean_weight` 0.75 in full at keep 0.5 and above, none at 0.25 and below (`mean_full_keep`, "
        "`mean_zero_keep`): at keep 0.1 and 0.2 it is the defaults (the section above's mean_weight 0 rows); at "
        "keep 0.5 it must hold as MEAN_RULE.md's pairs do (passkeys at most 2 below, NLL score at most 0.002 "
        "above), and RULER's tenth dev round must choose it. Rows: `bench/quality/study/mean_rows.json`.",
        [FADE_NLL] + FADE_PASSKEY)


def render_fade_one(doc: Dict) -> str:
    """The same check for the fade with mean_weight 1.0 (FADE_RULE.md's addendum, RULER's twelfth round), from
    quality_long_fade_one_choice.json: its rows beside the weight-0 rows of the first check's runs."""
    return _render_pairs(
        doc, "## The fade with mean_weight 1.0, at keep 0.5 on the library's own dev passkeys and NLL",
        "Rule, written before the run: the addendum of [`bench/quality/study/FADE_RULE.md`]"
        "(quality/study/FADE_RULE.md) — the same check and thresholds as the section above for `mean_weight` 1.0 "
        "(rows `bench/quality/study/fade_one_rows.json`), its weight-0 rows those the first check ran.",
        [FADE_NLL, FADE_ONE_NLL] + FADE_PASSKEY + FADE_ONE_PASSKEY)


def render_round18(doc: Dict) -> str:
    """RULER's eighteenth round (gamma 0.05 with KeyDiff's distance) on the base study's dev data at keep 0.1,
    0.2 and 0.5 (study/ROUND18_RULE.md), from quality_long_round18_choice.json."""
    return _render_pairs(
        doc, "## gamma 0.05 with KeyDiff's distance, at keep 0.1, 0.2 and 0.5 on the library's own dev passkeys and NLL",
        "Rule, written before the run: [`bench/quality/study/ROUND18_RULE.md`](quality/study/ROUND18_RULE.md) — "
        "RULER's eighteenth round's choice (`gamma` 0.05, `mean_distance` `key_cosine`) beside the defaults of "
        "that day, per layer and per sequence, over the three keep ratios together: passkeys at most 2 below, "
        "NLL score at most 0.002 above. Rows: `bench/quality/study/round18_rows.json`.",
        [ROUND18_NLL] + ROUND18_PASSKEY)
