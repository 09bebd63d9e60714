#!/usr/bin/env python3
"""Markdown, plots and the study's choice for the long-context evaluation
(bench/quality/long_eval.py, bench/results/quality_long*.json).

    render(doc) -> str               the RESULTS.md section of the main table
    render_passkey(doc[, heading]) -> str   the passkey section (per-template files, or the older
                                     single-template ones)
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

ORDER = ["flashcache-default", "flashcache-query", "flashcache-seq", "flashcache-rope", "flashcache-lowpass",
         "flashcache-paper", "streaming", "knorm", "keydiff", "random", "snapkv", "h2o"]
# The default row is the library's default of its run's date: the header's default options (printed with each
# table) say which; runs before 2026-12-07 had no distance from the mean (identical at keep 0.25 and below).
NAMES = {"flashcache-default": "FlashCache (library default as run: peak base, gamma 0.1, global)",
         "flashcache-query": "FlashCache with query tails (Options::with_query_tail())",
         "flashcache-seq": "FlashCache default, one keep-set per sequence (llama.cpp's cells)",
         "flashcache-rope": "FlashCache, default + de-rotated keys",
         "flashcache-lowpass": "FlashCache, previous default (low-pass, 64-token blocks, gamma 0.2)",
         "flashcache-paper": "FlashCache, paper preset",
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


def render_passkey(doc, heading: str = "## Passkey retrieval (SmolLM2-135M, 30 layers)") -> str:
    """The passkey section. Records with a "template" field (long_eval.py passkey since the
    template split): per split, hits/trials summed over the templates that ran and the mean share
    of the needle's tokens kept, per row and keep ratio; per-template hits of the default and the
    baselines; skipped templates and each template's length. Older single-template files: hits
    out of 5 per row and keep ratio, as before."""
    header, records = load(doc)
    if not records:
        return ""
    if not any("template" in r for r in records):
        return _render_passkey_single(header, records, heading)
    return _render_passkey_templates(header, records, heading)


def _render_passkey_single(header: Dict, records: List[Dict], heading: str) -> str:
    info = header.get("passkey", {})
    ratios = sorted({r["keep_ratio"] for r in records})
    hits = {(r["label"], r["keep_ratio"]): r["value"] for r in records if r.get("metric", "passkey_hits") ==
            "passkey_hits"}
    out = [heading, "",
           f"`{header.get('how', 'long_eval.py passkey')}`, {header.get('when', '?')}. A 5-digit key planted at "
           "depths 0.1-0.9 in repeated filler, asked at the end; the full cache found "
           + ", ".join(f"{v}/5 at ~{k} tokens" for k, v in info.get("full_cache_hits", {}).items())
           + f", so the rows run at ~{info.get('length')} tokens (the longest length with at least 4 of 5). "
           "Same budgets and protected set as the long-context table.", "",
           "| row | " + " | ".join(f"keep {r:g}" for r in ratios) + " |", "|---|" + "---|" * len(ratios)]
    for label in (l for l in ORDER if any(k[0] == l for k in hits)):
        out.append(f"| {NAMES.get(label, label)} | " +
                   " | ".join(f"{hits[(label, r)]}/5" if (label, r) in hits else "-" for r in ratios) + " |")
    out.append("")
    return "\n".join(out)


SPLIT_NAMES = {"dev": "Dev templates", "heldout": "Held-out templates"}
DEFAULT_LABELS = ("flashcache-default", "default")


def _row_order(header: Dict, records: List[Dict]) -> List[str]:
    """The header's row order, then ORDER, then any other label as it first appears."""
    labels = [row["label"] for row in header.get("rows", [])] + ORDER + [r["label"] for r in records]
    present = {r["label"] for r in records if r["label"] != "full"}
    out: List[str] = []
    for label in labels:
        if label in present and label not in out:
            out.append(label)
    return out


def _render_passkey_templates(header: Dict, records: List[Dict], heading: str) -> str:
    info = header.get("passkey", {}).get("templates", {})
    order = _row_order(header, records)
    policy = {r["label"]: r.get("policy") for r in records}
    ratios = sorted({r["keep_ratio"] for r in records if r["label"] != "full"})
    n_answer = header.get("passkey_answer_tokens", 8)
    out = [heading, "",
           f"`{header.get('how', 'long_eval.py passkey')}`, {header.get('when', '?')}, git "
           f"`{(header.get('git') or '?')[:10]}`; {header.get('seconds', 0) / 60:.0f} minutes. Templates and "
           "their dev / held-out split: `bench/quality/passkey_split.json` (fixed before any compressed run). "
           "Each template has 5 trials, the asked key at depths 0.1-0.9; a hit is the asked key in the "
           f"next {n_answer} greedy tokens. Per template the rows run at the longest length where the full cache "
           "finds at least 4 of 5 keys; a template with no such length is skipped for every row. "
           "`needle` = mean share of the asked needle's tokens kept in the compressed cache "
           "(over trials, layers and KV heads, then over templates).", ""]
    for split in ("dev", "heldout"):
        recs = [r for r in records if r.get("split") == split]
        if not recs:
            continue
        templates = [t for t in header.get("passkey_templates", []) if any(r["template"] == t for r in recs)]
        templates += sorted({r["template"] for r in recs} - set(templates))
        hits: Dict[Tuple[str, float], int] = {}
        trials: Dict[Tuple[str, float], int] = {}
        per_t: Dict[Tuple[str, str, float], Tuple[int, int]] = {}
        share: Dict[Tuple[str, float], List[float]] = {}
        for r in recs:
            key = (r["label"], r["keep_ratio"])
            if r["metric"] == "passkey_hits":
                n = int(r.get("trials", 5))
                hits[key] = hits.get(key, 0) + int(r["value"])
                trials[key] = trials.get(key, 0) + n
                per_t[(r["template"],) + key] = (int(r["value"]), n)
            elif r["metric"] == "needle_kept_share":
                share.setdefault(key, []).append(r["value"])
        name = SPLIT_NAMES.get(split, split)
        full = [(hits.get(("full", 1.0), 0), trials.get(("full", 1.0), 0))]
        out += [f"### {name}: hits over {len(templates)} template{'s' if len(templates) != 1 else ''}", "",
                f"Full cache at the same lengths: {full[0][0]}/{full[0][1]}.", "",
                "| row | " + " | ".join(f"hits {r:g}" for r in ratios) + " | " +
                " | ".join(f"needle {r:g}" for r in ratios) + " |",
                "|---|" + "---|" * (2 * len(ratios))]
        for label in order:
            if not any((label, r) in trials or (label, r) in share for r in ratios):
                continue
            cells = [f"{hits[(label, r)]}/{trials[(label, r)]}" if (label, r) in trials else "-" for r in ratios]
            cells += [f"{statistics.mean(share[(label, r)]):.3f}" if share.get((label, r)) else "-" for r in ratios]
            out.append(f"| {NAMES.get(label, label)} | " + " | ".join(cells) + " |")
        out.append("")
        # Per template: the default row and the baselines, hits at each ratio.
        shown = [l for l in order if l in DEFAULT_LABELS] + [l for l in order if policy.get(l) not in
                                                              ("flashcache", "full", None)]
        ratio_txt = " / ".join(f"{r:g}" for r in ratios)
        out += [f"Per template (hits out of 5 at keep {ratio_txt}):", "",
                "| template | kind | length | full | " + " | ".join(NAMES.get(l, l) for l in shown) + " |",
                "|---|---|---|---|" + "---|" * len(shown)]
        for t in templates:
            entry = info.get(t, {})
            toks = entry.get("prompt_tokens", {}).get(str(entry.get("length")), [])
            length = f"~{entry.get('length')}" + (f" ({min(toks)}-{max(toks)})" if toks and min(toks) != max(toks)
                                                 else f" ({toks[0]})" if toks else "")
            f_hits = per_t.get((t, "full", 1.0))
            cells = [" / ".join(str(per_t[(t, l, r)][0]) if (t, l, r) in per_t else "-" for r in ratios)
                     for l in shown]
            out.append(f"| {t} | {entry.get('kind', '?')} | {length} | "
                       f"{f'{f_hits[0]}/{f_hits[1]}' if f_hits else '-'} | " + " | ".join(cells) + " |")
        out.append("")
        skipped = [(t, e) for t, e in info.items() if e.get("split") == split and e.get("skipped")]
        if skipped:
            out += ["Skipped (the full cache finds fewer than 4 of 5 keys at every length tried): " +
                    "; ".join(f"{t} ({e.get('kind', '?')}, full cache " +
                              ", ".join(f"{h}/5 at ~{n}" for n, h in e.get("full_cache_hits", {}).items()) + ")"
                              for t, e in skipped) + ".", ""]
        ran = {t: info[t]["length"] for t in templates if info.get(t, {}).get("length")}
        if ran:
            text = (f"all {len(ran)} at ~{next(iter(ran.values()))} tokens" if len(set(ran.values())) == 1
                    else ", ".join(f"{t} ~{n}" for t, n in ran.items()))
            out += [f"Lengths the templates ran at (target prompt tokens): {text}.", ""]
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
