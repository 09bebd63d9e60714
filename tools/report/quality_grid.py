#!/usr/bin/env python3
"""Markdown section (and plot) for the 2D-grid evaluation, from bench/results/quality_grid.json.

    render(doc) -> str          the section for bench/RESULTS.md (doc: the parsed JSON or a path)
    plot(doc, path) -> path     held-out attention error vs keep ratio per row, one panel per
                                entry group (all, 224, 448, multi-image)
    python3 tools/report/quality_grid.py [--json PATH] [--plot PNG]
                                prints the section (and writes the PNG with --plot)

quality_grid.json is written by bench/quality/grid_eval (bench/quality/run_grid.sh); the
protocol is in bench/quality/README.md ("2D image grids").
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_JSON = os.path.join(ROOT, "bench", "results", "quality_grid.json")

ORDER = ["flashcache-1d-global", "flashcache-1d-blocked", "flashcache-2d-global", "flashcache-2d-tiles",
         "flashcache-1d-global+base", "flashcache-1d-blocked+base", "flashcache-2d-global+base",
         "flashcache-2d-tiles+base", "random", "knorm", "keydiff", "snapkv", "h2o"]
NAMES = {
    "flashcache-1d-global": "FlashCache 1D global",
    "flashcache-1d-blocked": "FlashCache 1D blocked (64)",
    "flashcache-2d-global": "FlashCache 2D global",
    "flashcache-2d-tiles": "FlashCache 2D tiles (8x8)",
    "flashcache-1d-global+base": "FlashCache 1D global + base",
    "flashcache-1d-blocked+base": "FlashCache 1D blocked + base",
    "flashcache-2d-global+base": "FlashCache 2D global + base",
    "flashcache-2d-tiles+base": "FlashCache 2D tiles + base",
    "random": "random",
    "knorm": "K-norm",
    "keydiff": "KeyDiff",
    "snapkv": "SnapKV (saw the queries)",
    "h2o": "H2O (saw the queries)",
}
GROUPS = [("all", "all entries"), ("224", "single photos at 224 (16 x 16 patches)"),
          ("448", "single photos at 448 (32 x 32 patches)"), ("multi-image", "sequences of 2-4 photos at 224")]
# The 2D rows and the 1D rows they replace.
PAIRS_1D = [("flashcache-2d-global", "flashcache-1d-global"), ("flashcache-2d-tiles", "flashcache-1d-blocked"),
            ("flashcache-2d-global+base", "flashcache-1d-global+base"),
            ("flashcache-2d-tiles+base", "flashcache-1d-blocked+base")]
ROWS_2D = ["flashcache-2d-global", "flashcache-2d-tiles", "flashcache-2d-global+base", "flashcache-2d-tiles+base"]
H2O_MARGIN = 0.10  # the 2D-grid study's goal: "within 10% of H2O"


def _load(doc) -> Dict:
    if isinstance(doc, str):
        with open(doc, encoding="utf-8") as f:
            doc = json.load(f)
    return doc


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _sorted(labels) -> List[str]:
    labels = set(labels)
    return [l for l in ORDER if l in labels] + sorted(labels - set(ORDER))


def aggregate(records, split: str, group: str = "all") -> Dict[Tuple[str, float], Tuple[float, float, int]]:
    """{(label, keep): (mean, median, entries)} over the entries of a split (and group)."""
    by: Dict[Tuple[str, float], List[float]] = {}
    for r in records:
        if r.get("split") != split or (group != "all" and r.get("group") != group):
            continue
        by.setdefault((r["label"], r["keep_ratio"]), []).append(r["error"])
    return {k: (statistics.fmean(v), statistics.median(v), len(v)) for k, v in by.items()}


def _row_table(agg, ratios, medians=True) -> List[str]:
    labels = _sorted(l for (l, _) in agg)
    best = {r: min(agg[(l, r)][0] for l in labels if (l, r) in agg) for r in ratios}
    rows = []
    for l in labels:
        cells = []
        for r in ratios:
            if (l, r) not in agg:
                cells.append("–")
                continue
            m, med, _ = agg[(l, r)]
            text = f"{m:.3f}" + (f" ({med:.3f})" if medians else "")
            cells.append(f"**{text}**" if abs(m - best[r]) < 1e-12 else text)
        rows.append([NAMES.get(l, l)] + cells)
    return _table(["row"] + [f"keep {r:g}" for r in ratios], rows)


def goals(records, ratios, split: str = "heldout") -> List[str]:
    """The 2D-grid study's goals, checked on the held-out mean errors."""
    agg = aggregate(records, split)
    have = {l for (l, _) in agg}
    out: List[str] = []

    def below(a: str, b: str) -> Optional[List[str]]:
        if a not in have or b not in have:
            return None
        return [f"{(agg[(a, r)][0] / agg[(b, r)][0] - 1) * 100:+.1f}%" for r in ratios]

    rows = []
    for a, b in PAIRS_1D + [(x, "random") for x in ROWS_2D]:
        d = below(a, b)
        if d is None:
            continue
        ok = all(agg[(a, r)][0] < agg[(b, r)][0] for r in ratios)
        rows.append([f"{NAMES.get(a, a)} vs {NAMES.get(b, b)}"] + d + ["yes" if ok else "no"])
    if rows:
        out += ["Goal 1, 2D below 1D and below random at every keep ratio (held-out mean error of the 2D row "
                "relative to the other; negative = 2D lower):", ""]
        out += _table(["comparison"] + [f"keep {r:g}" for r in ratios] + ["below at every ratio"], rows)
        out.append("")
    if "h2o" in have and 0.2 in ratios:
        h = agg[("h2o", 0.2)][0]
        rows = []
        for a in ["flashcache-2d-tiles", "flashcache-2d-tiles+base", "flashcache-2d-global",
                  "flashcache-2d-global+base"]:
            if a in have:
                x = agg[(a, 0.2)][0]
                rows.append([NAMES.get(a, a), f"{x:.3f}", f"{h:.3f}", f"{(x / h - 1) * 100:+.1f}%",
                             "yes" if x <= (1 + H2O_MARGIN) * h else "no"])
        out += [f"Goal 2, at keep 0.2 within {H2O_MARGIN:.0%} of H2O (held-out mean error; H2O saw the "
                "evaluated queries):", ""]
        out += _table(["row", "error", "H2O", "vs H2O", f"within {H2O_MARGIN:.0%}"], rows)
        out.append("")
    return out


def render(doc, title: str = "Image spans as 2D grids: ViT caches") -> str:
    doc = _load(doc)
    headers = doc.get("header", {})
    records = doc.get("records", [])
    sweep = doc.get("dev_sweep", {})
    choice = doc.get("choice", {})
    ratios = sorted({r["keep_ratio"] for r in records})
    lines = [f"## {title}", "",
             "Regenerate with `bench/quality/run_grid.sh` (protocol: bench/quality/README.md, \"2D image grids\"). "
             "Relative attention-output error of all N queries (non-causal) against the full cache, per entry the "
             "mean over its 4 layers, then the mean (median) over entries; lower is better, best per column in "
             "bold. Every row keeps the same n = round(keep x N) tokens per head and layer, CLS tokens protected. "
             "SnapKV and H2O score with the evaluated queries themselves (in-sample); no other row sees a query.",
             ""]
    for split in ("dev", "heldout"):
        h = headers.get(split)
        if not h:
            continue
        ents = h.get("entries", [])
        counts = {g: sum(1 for e in ents if e.get("group") == g) for g, _ in GROUPS[1:]}
        lines.append(f"- {split}: `{h.get('command')}` on {h.get('date')}, git {(h.get('git_revision') or '?')[:12]}"
                     f"{' (uncommitted changes)' if h.get('git_dirty') else ''}, {h.get('seconds', 0):.0f} s; "
                     f"{len(ents)} entries ({counts['224']} at 224, {counts['448']} at 448, "
                     f"{counts['multi-image']} multi-image): "
                     + ", ".join(f"`{e['name']}`" for e in ents) + f". Zone {h.get('zone')}, base share "
                     f"{h.get('base_share')} ({h.get('choice_source')}).")
    lines.append("")

    if sweep:
        shares = sweep.get("shares", [])
        lines += ["### Dev sweep: 2D low-pass zone x base share", "",
                  f"Metric: {sweep.get('metric')}.", ""]
        rows = []
        for z in sweep.get("zones", []):
            cells = []
            for s in shares:
                t = next((t for t in sweep["table"] if t["zone"] == z and t["base_share"] == s), None)
                text = "–" if t is None else f"{t['value']:.4f}"
                if t is not None and choice and z == choice.get("zone") and s == choice.get("base_share"):
                    text = f"**{text}**"
                cells.append(text)
            rows.append([z] + cells)
        lines += _table(["zone"] + [f"share {s:g}" for s in shares], rows)
        if sweep.get("table_1d"):
            lines += ["", "The 1D rows at the same shares (same metric over the 1D rows; they do not enter the "
                          "choice):", ""]
            rows = []
            for t in sweep["table_1d"]:
                vals = list(t["per_row"].values())
                rows.append([f"{t['base_share']:g}", f"{statistics.fmean(vals):.4f}" if vals else "–"]
                            + [f"{t['per_row'].get(l, float('nan')):.4f}"
                               for l in ("flashcache-1d-global", "flashcache-1d-blocked")])
            lines += _table(["share", "1D mean", "1D global", "1D blocked"], rows)
            rows = []
            for t in sweep["table"]:
                rows.append([t["zone"], f"{t['base_share']:g}"]
                            + [f"{t['per_row'].get(l, float('nan')):.4f}"
                               for l in ("flashcache-2d-global", "flashcache-2d-tiles")])
            lines += ["", "The 2D rows separately:", ""]
            lines += _table(["zone", "share", "2D global", "2D tiles"], rows)
        lines.append("")
    if choice:
        lines += [f"**Choice (dev only, before the held-out run):** zone `{choice.get('zone')}`, base share "
                  f"{choice.get('base_share'):g} (value {choice.get('value', 0):.4f}); the `+base` rows use it, the "
                  "rows without `+base` have share 0.", ""]
        best = max(sweep.get("shares", [0])) if sweep else None
        if best is not None and choice.get("base_share") == best:
            lines += [f"The chosen share is the largest tried ({best:g}): the dev error was still falling with "
                      "the share, so a larger one might do better still; the grid of shares was fixed "
                      "before the run and was not extended.", ""]

    for split, title in (("heldout", "Held-out"), ("dev", "Dev")):
        if not any(r.get("split") == split for r in records):
            continue
        lines += [f"### {title}: mean (median) attention error over entries", ""]
        for g, name in GROUPS:
            agg = aggregate(records, split, g)
            if not agg:
                continue
            n = max(v[2] for v in agg.values())
            lines += [f"**{name}** ({n} entries)", ""] + _row_table(agg, ratios) + [""]
        if split == "heldout":
            png = os.path.join(ROOT, "bench", "results", "quality_grid.png")
            if os.path.exists(png):
                lines += ["![held-out attention error vs keep ratio](results/quality_grid.png)", ""]
            lines += goals(records, ratios, "heldout")
    random_std = [r["error_std_over_seeds"] for r in records if "error_std_over_seeds" in r]
    if random_std:
        lines += [f"Random: mean over seeds 0-4 (std over seeds of an entry's error at most {max(random_std):.3f}).",
                  ""]
    return "\n".join(lines)


def plot(doc, path: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = _load(doc)
    records = doc.get("records", [])
    split = "heldout" if any(r.get("split") == "heldout" for r in records) else "dev"
    ratios = sorted({r["keep_ratio"] for r in records})
    groups = [(g, n) for g, n in GROUPS if aggregate(records, split, g)]
    from matplotlib.ticker import NullFormatter
    cols = 2 if len(groups) > 1 else 1
    nrows = (len(groups) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols + 2.6, 4.0 * nrows), sharey=True, squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(groups):]:
        ax.axis("off")
    style = {
        "flashcache-1d-global": ("tab:blue", "--", "o"), "flashcache-1d-blocked": ("tab:cyan", "--", "o"),
        "flashcache-2d-global": ("tab:red", "-", "s"), "flashcache-2d-tiles": ("tab:orange", "-", "s"),
        "flashcache-1d-global+base": ("tab:blue", ":", "^"), "flashcache-1d-blocked+base": ("tab:cyan", ":", "^"),
        "flashcache-2d-global+base": ("darkred", "-", "D"), "flashcache-2d-tiles+base": ("darkorange", "-", "D"),
        "random": ("black", "-.", "x"), "knorm": ("tab:gray", ":", "v"), "keydiff": ("tab:olive", ":", "v"),
        "snapkv": ("tab:purple", ":", "P"), "h2o": ("tab:green", "-.", "P"),
    }
    for ax, (g, name) in zip(flat, groups):
        agg = aggregate(records, split, g)
        for l in _sorted(l for (l, _) in agg):
            xs = [r for r in ratios if (l, r) in agg]
            c, ls, m = style.get(l, ("gray", "-", "."))
            ax.plot(xs, [agg[(l, r)][0] for r in xs], color=c, linestyle=ls, marker=m, markersize=4,
                    label=NAMES.get(l, l))
        ax.set_xscale("log")
        ax.set_xticks(ratios)
        ax.set_xticklabels([f"{r:g}" for r in ratios])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{split}: {name}", fontsize=9)
        ax.set_xlabel("keep ratio")
        ax.grid(True, alpha=0.3)
    for row in axes:
        row[0].set_ylabel("relative attention error\n(mean over entries)")
    handles, labels = flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="center right")
    fig.tight_layout(rect=(0, 0, 1 - 2.6 / (5.2 * cols + 2.6), 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=DEFAULT_JSON)
    ap.add_argument("--plot", metavar="PNG", help="write the held-out plot here")
    a = ap.parse_args(argv)
    doc = _load(a.json)
    if a.plot:
        plot(doc, a.plot)
    print(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())


def render_defaults(doc) -> str:
    """The library's defaults as a user calls them (with and without --grid) on the same caches."""
    return render(doc, "The library's defaults on ViT caches (with and without the image spans)")
