#!/usr/bin/env python3
"""Markdown, plots and the study's choice for the long-context evaluation
(bench/quality/long_eval.py, bench/results/quality_long*.json).

    render(doc) -> str               the RESULTS.md section of the main table
    plot(doc, path)                  nll_ratio against keep ratio, one panel per prompt length
    study(paths) -> (text, best)     the study's ranking on dev texts and the chosen label
    python3 tools/report/quality_long.py [--json PATH] [--plot PNG] [--study JSON ...]

The study's rule, fixed before its first run: a variant's score is the mean over the keep
ratios it ran at of the median, over the dev (text, prompt length) units, of nll_ratio;
the lowest score wins; variants within 0.002 of the best are tied and the lower mean
attention error among them wins.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Dict, List, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_JSON = os.path.join(ROOT, "bench", "results", "quality_long.json")
STUDY_TIE = 0.002

ORDER = ["flashcache-default", "flashcache-rope", "flashcache-paper", "streaming", "knorm", "keydiff", "random", "snapkv", "h2o"]
NAMES = {"flashcache-default": "FlashCache (library default)",
         "flashcache-rope": "FlashCache, default + de-rotated keys, gamma 0.1", "flashcache-paper": "FlashCache, paper preset",
         "streaming": "StreamingLLM", "knorm": "K-norm", "keydiff": "KeyDiff", "random": "random",
         "snapkv": "SnapKV", "h2o": "H2O"}
ATTENTION_FREE = ["streaming", "knorm", "keydiff", "random"]


def load(doc) -> Tuple[Dict, List[Dict]]:
    if isinstance(doc, str):
        with open(doc, encoding="utf-8") as f:
            doc = json.load(f)
    return doc.get("header", {}), doc.get("records", [])


def values(records, metric: str, **where) -> Dict[Tuple[str, float], List[float]]:
    """(label, keep_ratio) -> values of `metric` over the records matching `where`."""
    out: Dict[Tuple[str, float], List[float]] = {}
    for r in records:
        if r["metric"] != metric or any(r.get(k) != v for k, v in where.items()):
            continue
        out.setdefault((r["label"], r["keep_ratio"]), []).append(r["value"])
    return out


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# ----------------------------------------------------------------------------------------
# Study.
# ----------------------------------------------------------------------------------------

def study(paths: Sequence[str]) -> Tuple[str, str]:
    records: List[Dict] = []
    for p in paths:
        header, recs = load(p)
        if any(r.get("split") != "dev" for r in recs if r["label"] != "full"):
            raise SystemExit(f"{p}: the study must hold dev texts only")
        records += recs
    nll = values(records, "nll_ratio")
    err = values(records, "attn_rel_err")
    labels = sorted({label for label, _ in nll})
    # Only FlashCache variants can be chosen; baselines run beside them for reference.
    choosable = {r["label"] for r in records if r.get("policy") == "flashcache"}
    ratios = sorted({r for _, r in nll})
    rows = []
    for label in labels:
        meds = [median(nll.get((label, r), [])) for r in ratios]
        errs = [statistics.mean(err[(label, r)]) for r in ratios if (label, r) in err]
        rows.append((statistics.mean(meds), label, meds, statistics.mean(errs) if errs else float("nan")))
    rows.sort()
    best_score = min(r[0] for r in rows if r[1] in choosable)
    tied = [r for r in rows if r[1] in choosable and r[0] <= best_score + STUDY_TIE]
    best = min(tied, key=lambda r: r[3])[1]
    lines = ["| variant | score | " + " | ".join(f"median nll_ratio @{r:g}" for r in ratios) +
             " | mean attn err |", "|---|---|" + "---|" * len(ratios) + "---|"]
    for score, label, meds, e in rows:
        mark = " **(chosen)**" if label == best else ""
        lines.append(f"| {label}{mark} | {score:.4f} | " + " | ".join(f"{m:.4f}" for m in meds) +
                     f" | {e:.3f} |")
    return "\n".join(lines), best


# ----------------------------------------------------------------------------------------
# Main table.
# ----------------------------------------------------------------------------------------

def _cell(xs: Sequence[float], fmt: str = "{:.3f}") -> str:
    return fmt.format(median(xs)) if xs else "-"


def render(doc) -> str:
    header, records = load(doc)
    if not records:
        return ""
    ratios = sorted({r["keep_ratio"] for r in records if r["label"] != "full"})
    lengths = sorted({r["prompt_tokens"] for r in records})
    labels = [l for l in ORDER if any(r["label"] == l for r in records)]
    out = ["## Long-context quality (SmolLM2-135M, 30 layers, prompts of 1K-4K tokens)", "",
           f"`{header.get('how', 'bench/quality/long_eval.py table')}`, {header.get('when', '?')}, git "
           f"`{(header.get('git') or '?')[:10]}`; {header.get('seconds', 0) / 60:.0f} minutes. Texts from Debian "
           "packages, split into dev and held-out halves before the first run "
           "(`bench/quality/long_split.json`); the defaults were chosen on dev texts only "
           "(`bench/quality/README.md`, the study). Every row keeps round(r x P) tokens per KV head and layer "
           "(30 x that in all) and every row but the paper preset has the same protected set "
           f"(default options: `{json.dumps(header.get('default_options', {}))}`).", "",
           "Cells: median over the split's texts. `nll_ratio` = teacher-forced NLL of the true next "
           f"{header.get('continuation_tokens', 256)} tokens over the full cache's (lower is better, 1 = no "
           f"loss); `greedy` = share of {header.get('greedy_tokens', 64)} greedy tokens equal to the full "
           "cache's; `attn` = mean over layers of the continuation queries' attention-output error.", ""]
    for split in ("heldout", "dev"):
        if not any(r.get("split") == split for r in records):
            continue
        for p in [None] + lengths:
            where = {"split": split} if p is None else {"split": split, "prompt_tokens": p}
            nll = values(records, "nll_ratio", **where)
            if not nll:
                continue
            greedy = values(records, "greedy_match", **where)
            attn = values(records, "attn_rel_err", **where)
            name = "Held-out" if split == "heldout" else "Dev"
            title = f"{name} texts, all prompt lengths (median of {len(next(iter(nll.values())))} text x length units)" \
                if p is None else f"{name} texts, P = {p} tokens"
            out += [f"### {title}", "",
                    "| row | " + " | ".join(f"nll_ratio {r:g}" for r in ratios) + " | " +
                    " | ".join(f"greedy {r:g}" for r in ratios) + " | " +
                    " | ".join(f"attn {r:g}" for r in ratios) + " |",
                    "|---|" + "---|" * (3 * len(ratios))]
            for label in labels:
                out.append(f"| {NAMES.get(label, label)} | " +
                           " | ".join(_cell(nll.get((label, r), [])) for r in ratios) + " | " +
                           " | ".join(_cell(greedy.get((label, r), []), "{:.2f}") for r in ratios) + " | " +
                           " | ".join(_cell(attn.get((label, r), [])) for r in ratios) + " |")
            out.append("")
    return "\n".join(out)


def render_passkey(doc) -> str:
    """Hits out of 5 per row and keep ratio, at the length the full cache still solves."""
    header, records = load(doc)
    info = header.get("passkey", {})
    if not records:
        return ""
    ratios = sorted({r["keep_ratio"] for r in records})
    hits = {(r["label"], r["keep_ratio"]): r["value"] for r in records}
    out = ["## Passkey retrieval (SmolLM2-135M, 30 layers)", "",
           f"`{header.get('how', 'long_eval.py passkey')}`, {header.get('when', '?')}. A 5-digit key planted at "
           "depths 0.1-0.9 in repeated filler, asked at the end; the full cache found "
           + ", ".join(f"{v}/5 at ~{k} tokens" for k, v in info.get("full_cache_hits", {}).items())
           + f", so the rows run at ~{info.get('length')} tokens (the longest length with at least 4 of 5). "
           "Same budgets and protected set as the long-context table.", "",
           "| row | " + " | ".join(f"keep {r:g}" for r in ratios) + " |", "|---|" + "---|" * len(ratios)]
    for label in (l for l in ORDER if any(k[0] == l for k in hits)):
        out.append(f"| {NAMES.get(label, label)} | " + " | ".join(f"{hits[(label, r)]}/5" for r in ratios) + " |")
    out.append("")
    return "\n".join(out)


def summary(doc, split: str = "heldout") -> str:
    """The closing-note numbers: per keep ratio, the median nll_ratio over every unit of the split."""
    _, records = load(doc)
    nll = values(records, "nll_ratio", split=split)
    attn = values(records, "attn_rel_err", split=split)
    ratios = sorted({r for _, r in nll})
    lines = []
    for r in ratios:
        cells = ", ".join(f"{l} {median(nll[(l, r)]):.3f}" for l in ORDER if (l, r) in nll)
        lines.append(f"keep {r:g}: {cells}")
        d = median(nll.get(("flashcache-default", r), []))
        free = {l: median(nll[(l, r)]) for l in ATTENTION_FREE if (l, r) in nll}
        beats = all(d < v for v in free.values())
        snap = median(nll.get(("snapkv", r), []))
        ea, es = median(attn.get(("flashcache-default", r), [])), median(attn.get(("snapkv", r), []))
        lines.append(f"  default beats every attention-free baseline: {beats}; gap to SnapKV "
                     f"{d - snap:+.3f}; attention error default {ea:.3f} vs SnapKV {es:.3f} "
                     f"({(ea / es - 1) * 100:+.0f}%)")
    return "\n".join(lines)


def plot(doc, path: str, split: str = "heldout") -> None:
    """Median nll_ratio against keep ratio, one column per prompt length; the second row
    leaves out the paper preset, whose losses would flatten every other line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    _, records = load(doc)
    lengths = sorted({r["prompt_tokens"] for r in records})
    fig, axes = plt.subplots(2, len(lengths), figsize=(5 * len(lengths), 8), squeeze=False)
    for col, p in enumerate(lengths):
        nll = values(records, "nll_ratio", split=split, prompt_tokens=p)
        for row, skip in ((0, ()), (1, ("flashcache-paper",))):
            ax = axes[row][col]
            for label in (l for l in ORDER if l not in skip and any(k[0] == l for k in nll)):
                ratios = sorted(r for l, r in nll if l == label)
                ax.plot(ratios, [median(nll[(label, r)]) for r in ratios], marker="o",
                        color=f"C{ORDER.index(label)}", label=NAMES.get(label, label))
            ax.set_xscale("log")
            ax.set_xticks([0.05, 0.1, 0.2, 0.4], ["0.05", "0.1", "0.2", "0.4"])
            ax.minorticks_off()
            ax.set_xlabel("keep ratio")
            ax.set_ylabel("median nll_ratio (1 = full cache)")
            ax.set_title(f"{split} texts, P = {p}" + (" (without the paper preset)" if skip else ""))
            ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=DEFAULT_JSON)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--study", nargs="*", default=None)
    ap.add_argument("--summary", action="store_true")
    args = ap.parse_args(argv)
    if args.study:
        text, best = study(args.study)
        print(text)
        print(f"\nchosen: {best}")
        return 0
    if args.summary:
        print(summary(args.json))
        return 0
    print(render(args.json))
    if args.plot:
        plot(args.json, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
