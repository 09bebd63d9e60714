#!/usr/bin/env python3
"""Markdown section (and plots) for the quality evaluation, from bench/results/quality.json.

    render(doc) -> str         the section for bench/RESULTS.md (doc: the parsed JSON, a
                               path to it, or a bare list of records)
    plot(doc, out_dir) -> [..] PNGs of attention error vs keep ratio per policy, one per
                               model (quality_<model>.png), and quality_end_to_end.png
    python3 tools/report/quality.py [--json PATH] [--plots]   prints the section
                               (and writes the PNGs beside the JSON with --plots)

quality.json is written by bench/quality/quality_eval (parts "attention" and "energy")
and tools/extract/eval_end_to_end.py (part "end_to_end"); see bench/quality/README.md.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_JSON = os.path.join(ROOT, "bench", "results", "quality.json")

# The FlashCache row every baseline is compared with (the paper's form), and the order
# rows are shown in.
REFERENCE = "flashcache-global"
ORDER = ["full", "flashcache-global", "flashcache-blocked", "flashcache-global-noalloc",
         "flashcache-blocked-noalloc", "streaming", "knorm", "random", "snapkv", "h2o"]
BASELINES = ["streaming", "knorm", "random", "snapkv", "h2o"]
NAMES = {
    "full": "full cache",
    "flashcache-global": "FlashCache global",
    "flashcache-blocked": "FlashCache blocked (64)",
    "flashcache-global-noalloc": "FlashCache global, no allocation",
    "flashcache-blocked-noalloc": "FlashCache blocked, no allocation",
    "streaming": "StreamingLLM",
    "knorm": "K-norm",
    "random": "random",
    "snapkv": "SnapKV",
    "h2o": "H2O",
}
# Tie rules, fixed before looking at the numbers (lower is better for error and NLL).
TIE_RELATIVE_ERR = 0.02   # attention error: within 2% of each other
TIE_NLL = 0.02            # NLL: within 0.02 nats/token
# needle: the same number of hits


def _load(doc):
    if isinstance(doc, str):
        with open(doc, encoding="utf-8") as f:
            doc = json.load(f)
    if isinstance(doc, list):
        return {}, doc
    return doc.get("header", {}), doc.get("records", [])


def _label(r: Dict) -> str:
    return (r.get("options") or {}).get("label") or r["policy"]


def _name(label: str) -> str:
    return NAMES.get(label, label)


def _sorted_labels(labels) -> List[str]:
    labels = set(labels)
    return [l for l in ORDER if l in labels] + sorted(labels - set(ORDER))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _values(records, part, metric, model=None, with_layer=False) -> Dict:
    """{(model, label, keep_ratio[, layer]): value}."""
    out = {}
    for r in records:
        if r.get("part") != part or r.get("metric") != metric:
            continue
        if model is not None and r.get("model") != model:
            continue
        if ("layer" in r) != with_layer:
            continue
        key = (r["model"], _label(r), r.get("keep_ratio"))
        out[key + ((r["layer"],) if with_layer else ())] = r["value"]
    return out


def _verdict(ours: float, theirs: float, metric: str) -> str:
    """win / tie / loss for FlashCache (lower is better except needle accuracy)."""
    if metric == "needle_accuracy":
        return "tie" if abs(ours - theirs) < 1e-9 else ("win" if ours > theirs else "loss")
    if metric == "nll":
        return "tie" if abs(ours - theirs) <= TIE_NLL else ("win" if ours < theirs else "loss")
    if abs(ours - theirs) <= TIE_RELATIVE_ERR * max(abs(ours), abs(theirs)):
        return "tie"
    return "win" if ours < theirs else "loss"


def _sentence(text: str) -> str:
    text = text.strip()
    if not text:
        return ""
    return text[0].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _lookup(table, model, label, ratio):
    """A table cell; the full cache is recorded once, at keep ratio 1.0, and fills every column."""
    v = table.get((model, label, ratio))
    if v is None and label == "full":
        v = table.get((model, label, 1.0))
    return v


def _fmt(x: Optional[float], digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _metric_table(vals: Dict, model: str, ratios, lower_better=True, digits=3, fmt=None, bold=True) -> List[str]:
    labels = _sorted_labels(l for (m, l, _) in vals if m == model)
    rows = []
    best = {}
    for r in ratios:
        cand = [vals[(model, l, r)] for l in labels if (model, l, r) in vals and l != "full"]
        if cand:
            best[r] = min(cand) if lower_better else max(cand)
    for l in labels:
        cells = []
        for r in ratios:
            v = _lookup(vals, model, l, r)
            text = fmt(v) if fmt else _fmt(v, digits)
            if bold and v is not None and l != "full" and r in best and abs(v - best[r]) < 1e-12:
                text = f"**{text}**"
            cells.append(text)
        rows.append([_name(l)] + cells)
    return _table(["policy"] + [f"keep {r:g}" for r in ratios], rows)


def render(doc) -> str:
    headers, records = _load(doc)
    att = headers.get("attention", {})
    e2e = headers.get("end_to_end", {})
    lines = ["## Quality: FlashCache beside the baselines on real KV caches", "",
             "Regenerate everything below with `bench/quality/run.sh` (see bench/quality/README.md for the "
             "protocol). Nothing in the evaluation is fitted to its data: library defaults throughout.", ""]

    # ------------------------------------------------------------------ provenance
    if att:
        lines += [f"Attention error and energy: `{att.get('command')}` on {att.get('date')}, git "
                  f"{(att.get('git_revision') or '?')[:12]}{' (uncommitted changes)' if att.get('git_dirty') else ''}, "
                  f"{att.get('seconds', 0):.0f} s. Fixtures:", ""]
        for fx in att.get("fixtures", []):
            lines.append(f"- `{fx['path']}`: {fx['model']}, K {fx['shape_k']} (layers {fx['model_layers']} "
                         f"of the model, {fx['q_heads']} query heads), {fx['tokens']} tokens. "
                         f"Protocol: {fx['protocol']}.")
        lines += ["", f"Metric: {att.get('metric')}. Budget: {att.get('budget')}. Settings: "
                  f"{att.get('defaults')}.", ""]
    if e2e:
        lines += [f"End to end: `{e2e.get('command')}` on {e2e.get('date')}, git "
                  f"{(e2e.get('git_revision') or '?')[:12]}{' (uncommitted changes)' if e2e.get('git_dirty') else ''}, "
                  f"{e2e.get('seconds', 0):.0f} s. Model: {e2e.get('model')}. Budget: {e2e.get('budget')}. "
                  f"Settings: {e2e.get('defaults')}.", ""]

    # ------------------------------------------------------------- attention error
    att_vals = _values(records, "attention", "attn_rel_err")
    models = sorted({m for (m, _, _) in att_vals})
    ratios = sorted({r for (_, _, r) in att_vals})
    std = _values(records, "attention", "attn_rel_err_std_over_seeds")
    if att_vals:
        lines += ["### Attention-output error (LLM: held-out queries; ViT: all queries)", "",
                  "Relative error ||A(Q,K',V') - A(Q,K,V)|| / ||A(Q,K,V)||, mean over the fixture's layers "
                  "(lower is better; best per column in bold). Random: mean over seeds"
                  + (" (std over seeds up to "
                     f"{max(std.values()):.3f})" if std else "") + ".", ""]
        for m in models:
            fx = next((f for f in att.get("fixtures", []) if f["name"] == m), {})
            lines += [f"**{m}** ({fx.get('model', '')})", ""]
            lines += _metric_table(att_vals, m, ratios)
            png = os.path.join(ROOT, "bench", "results", f"quality_{m}.png")
            if os.path.exists(png):
                lines += ["", f"![attention error vs keep ratio, {m}](results/quality_{m}.png)"]
            lines.append("")
        per_layer = _values(records, "attention", "attn_rel_err", with_layer=True)
        if per_layer:
            lines += ["<details><summary>Per layer</summary>", ""]
            for m in models:
                layers = sorted({k[3] for k in per_layer if k[0] == m})
                labels = _sorted_labels({k[1] for k in per_layer if k[0] == m})
                rows = []
                for l in labels:
                    for r in ratios:
                        rows.append([_name(l), f"{r:g}"] + [_fmt(per_layer.get((m, l, r, ly))) for ly in layers])
                lines += [f"**{m}**", ""] + _table(["policy", "keep"] + [f"layer {ly}" for ly in layers], rows)
                lines.append("")
            first = _values(records, "attention", "first_token_kept_share")
            if first:
                lines += ["Share of (layer, KV head) pairs that kept token 0 (the attention sink of a causal "
                          "LLM; the CLS token of the ViT):", ""]
                for m in models:
                    lines += [f"**{m}**", ""] + _metric_table(first, m, ratios, digits=2, bold=False)
                    lines.append("")
            lines += ["</details>", ""]

    # ------------------------------------------------------------------ end to end
    nll = _values(records, "end_to_end", "nll")
    needle = _values(records, "end_to_end", "needle_accuracy")
    kept = _values(records, "end_to_end", "needle_kept_fraction")
    e2e_model = next((m for (m, _, _) in list(nll) + list(needle)), None)
    e2e_ratios = sorted({r for (_, l, r) in list(nll) + list(needle) if l != "full"})
    if e2e_model:
        lines += [f"### End to end: {e2e_model}", ""]
        if nll:
            docs = (e2e.get("nll") or {}).get("documents", [])
            lines += ["Mean NLL (nats/token) of a held-out ground-truth continuation decoded over the "
                      "compressed prompt cache (lower is better). "
                      + _sentence((e2e.get("nll") or {}).get("protocol", "")) + " Documents: " + ", ".join(f"{d['title']} ({d['prompt_tokens']} prompt + "
                                                   f"{d['continuation_tokens']} continuation tokens)"
                                                   for d in docs) + ". Window 0 for every policy.", ""]
            lines += _metric_table(nll, e2e_model, e2e_ratios)
            lines.append("")
        if needle:
            info = e2e.get("needle") or {}
            trials = info.get("trials", [])
            n_trials = len(trials)
            sizes = sorted({t["prompt_tokens"] for t in trials})
            size = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}–{sizes[-1]}"
            lines += [f"Needle retrieval: hits out of {n_trials} trials (needle depths "
                      + ", ".join(f"{t['depth']:g}" for t in trials)
                      + f"; prompts of {size} tokens; every policy keeps the "
                        f"last {trials[0]['window'] if trials else '?'} tokens, the question and the chat tail). "
                      "In brackets: the share of the needle sentence's tokens kept, mean over layers and KV "
                      "heads. " + _sentence(info.get("protocol", "")), ""]

            def fmt_needle(label):
                def f(v):
                    return "–" if v is None else f"{round(v * n_trials)}/{n_trials}"
                return f
            labels = _sorted_labels(l for (m, l, _) in needle if m == e2e_model)
            rows = []
            for l in labels:
                cells = []
                for r in e2e_ratios:
                    v = _lookup(needle, e2e_model, l, r)
                    k = kept.get((e2e_model, l, r))
                    cells.append(fmt_needle(l)(v) + (f" ({k:.2f})" if k is not None else ""))
                rows.append([_name(l)] + cells)
            lines += _table(["policy"] + [f"keep {r:g}" for r in e2e_ratios], rows)
            png = os.path.join(ROOT, "bench", "results", "quality_end_to_end.png")
            if os.path.exists(png):
                lines += ["", "![end to end vs keep ratio](results/quality_end_to_end.png)"]
            lines.append("")

    # ----------------------------------------------------------- wins, ties, losses
    if att_vals or nll or needle:
        lines += ["### Where FlashCache wins, ties and loses",
                  "",
                  f"FlashCache global with dynamic allocation (the paper's form) against each baseline, "
                  f"same total budget. Tie: within {TIE_RELATIVE_ERR:.0%} for the attention error, within "
                  f"{TIE_NLL} nats/token for the NLL, the same number of needle hits (fixed before the runs; "
                  f"with 5 needle trials one hit is 20 points, so the needle column is weak evidence).", ""]
        columns, header = [], ["baseline"]
        for m in models:
            for r in ratios:
                columns.append(("att", m, r))
                header.append(f"attn {m} {r:g}")
        if e2e_model:
            for r in e2e_ratios:
                if nll:
                    columns.append(("nll", e2e_model, r))
                    header.append(f"NLL {r:g}")
            for r in e2e_ratios:
                if needle:
                    columns.append(("needle_accuracy", e2e_model, r))
                    header.append(f"needle {r:g}")
        rows = []
        counts = {}
        verdicts = {}
        for b in BASELINES:
            cells = []
            for kind, m, r in columns:
                vals = att_vals if kind == "att" else nll if kind == "nll" else needle
                ours, theirs = vals.get((m, REFERENCE, r)), vals.get((m, b, r))
                v = "–" if ours is None or theirs is None else _verdict(ours, theirs, kind)
                cells.append(v)
                verdicts[(b, kind, m, r)] = v
                counts[v] = counts.get(v, 0) + 1
            wtl = f"{cells.count('win')}/{cells.count('tie')}/{cells.count('loss')}"
            rows.append([_name(b), wtl] + cells)
        lines += _table([header[0], "W/T/L"] + header[1:], rows)
        lines += ["", f"In all: {counts.get('win', 0)} wins, {counts.get('tie', 0)} ties, "
                      f"{counts.get('loss', 0)} losses."]
        in_sample = [f["name"] for f in att.get("fixtures", []) if "saw the evaluation queries" in f.get("protocol", "")]
        if in_sample:
            lines += [f"On {', '.join(in_sample)} SnapKV and H2O scored tokens with the evaluation queries "
                      "themselves (there are no held-out queries), which favours them in those columns."]
        lines.append("")
        lines += ["**Closing note** (generated from the verdicts above): FlashCache global with dynamic "
                  "allocation, against"]
        kinds = []
        for kind, m, _r in columns:
            if (kind, m) not in kinds:
                kinds.append((kind, m))
        kind_name = {"att": "attention error", "nll": "NLL", "needle_accuracy": "needle"}
        for b in BASELINES:
            parts = []
            for kind, m in kinds:
                by = {}
                for kk, mm, r in columns:
                    if (kk, mm) == (kind, m) and verdicts.get((b, kk, mm, r), "–") != "–":
                        by.setdefault(verdicts[(b, kk, mm, r)], []).append(f"{r:g}")
                if not by:
                    continue
                what = kind_name[kind] + (f" ({m})" if kind == "att" else "")
                n_r = sum(len(v) for v in by.values())
                verb = {"win": "wins", "tie": "ties", "loss": "loses"}
                bits = [f"{verb[verdict]} {'at every ratio' if len(rs) == n_r else 'at ' + ', '.join(rs)}"
                        for verdict, rs in sorted(by.items(), key=lambda kv: ["win", "tie", "loss"].index(kv[0]))]
                parts.append(f"{what}: " + ", ".join(bits))
            if parts:
                lines.append(f"- {_name(b)}: " + "; ".join(parts) + ".")
        lines.append("")
        # The FlashCache variants against each other.
        var_rows = []
        for variant in ["flashcache-blocked", "flashcache-global-noalloc", "flashcache-blocked-noalloc"]:
            cells = []
            for kind, m, r in columns:
                vals = att_vals if kind == "att" else nll if kind == "nll" else needle
                ours, theirs = vals.get((m, REFERENCE, r)), vals.get((m, variant, r))
                cells.append("–" if ours is None or theirs is None else _verdict(ours, theirs, kind))
            if any(c != "–" for c in cells):
                var_rows.append([_name(variant)] + cells)
        if var_rows:
            lines += ["FlashCache global with dynamic allocation against its own variants, same rule (win: "
                      "global with dynamic allocation is better):", ""]
            lines += _table(["variant"] + header[1:], var_rows)
            lines.append("")

    # ---------------------------------------------------------------------- energy
    energy = [r for r in records if r.get("part") == "energy" and r.get("metric") == "energy_below_cutoff"]
    if energy:
        lines += ["### Energy below the low-pass cutoff (the paper's founding observation)", "",
                  "Share of the K and V energy in the lowest ceil(0.2 N) DCT frequencies along the tokens "
                  "(global transform over the compressed tokens; all layers and heads of the fixture pooled; "
                  "range over layers in brackets). Controls: *centered* removes each head's per-column mean "
                  "first (the DC term carries the mean); *shuffled* permutes the tokens (keeps the mean, "
                  "destroys order); *centered + shuffled* is about 0.2 for tokens without order. The paper: "
                  "more than 90% of the energy sits in the low frequencies.", ""]
        rows = []
        for m in sorted({r["model"] for r in energy}):
            kind = next(r["options"]["tokens"] for r in energy if r["model"] == m)
            for t in ("K", "V"):
                cells = [m, kind, t]
                for variant in ("raw", "centered", "shuffled", "centered_shuffled"):
                    pooled = [r["value"] for r in energy if r["model"] == m and "layer" not in r
                              and r["options"]["tensor"] == t and r["options"]["variant"] == variant]
                    per = [r["value"] for r in energy if r["model"] == m and "layer" in r
                           and r["options"]["tensor"] == t and r["options"]["variant"] == variant]
                    cell = _fmt(pooled[0] if pooled else None)
                    if per and variant in ("raw", "centered"):
                        cell += f" ({min(per):.2f}–{max(per):.2f})"
                    cells.append(cell)
                over = [r["value"] for r in records if r.get("part") == "energy" and r["model"] == m
                        and r.get("metric") == "share_of_heads_over_0.9" and r["options"]["variant"] == "raw"]
                cells.append(_fmt(over[0], 2) if over and t == "K" else "")
                rows.append(cells)
        lines += _table(["fixture", "tokens", "tensor", "raw", "centered", "shuffled", "centered + shuffled",
                         "K heads > 0.9 (raw)"], rows)
        lines += ["", "Each fixture holds one kind of token: the LLM prompt is all text, the ViT image all "
                      "visual; no fixture mixes both, so the visual-versus-text split inside one multimodal "
                      "prompt is not measured here.", ""]
    return "\n".join(lines)


# -------------------------------------------------------------------------- plots

def plot(doc, out_dir: str) -> List[str]:
    """Writes quality_<model>.png (attention error vs keep ratio, one line per policy) and
    quality_end_to_end.png (NLL and needle hits vs keep ratio); returns the paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    _, records = _load(doc)
    written = []
    style = {l: ("-" if l.startswith("flashcache") else "--") for l in ORDER}
    att = _values(records, "attention", "attn_rel_err")
    for m in sorted({k[0] for k in att}):
        fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=110)
        for l in _sorted_labels({k[1] for k in att if k[0] == m}):
            pts = sorted((r, v) for (mm, ll, r), v in att.items() if mm == m and ll == l)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style.get(l, "-"), marker="o", label=_name(l))
        ax.set_xscale("log")
        ratios = sorted({k[2] for k in att if k[0] == m})
        ax.set_xticks(ratios, [f"{r:g}" for r in ratios])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("keep ratio")
        ax.set_ylabel("relative attention-output error (mean over layers)")
        ax.set_title(f"{m}: attention-output error vs keep ratio")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out_dir, f"quality_{m}.png")
        fig.savefig(path)
        plt.close(fig)
        written.append(path)

    nll = _values(records, "end_to_end", "nll")
    needle = _values(records, "end_to_end", "needle_accuracy")
    if nll or needle:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), dpi=110)
        for ax, vals, ylabel in ((axes[0], nll, "NLL of the continuation (nats/token)"),
                                 (axes[1], needle, "needle hits (share of trials)")):
            full = [v for (m, l, r), v in vals.items() if l == "full"]
            for l in _sorted_labels({k[1] for k in vals if k[1] != "full"}):
                pts = sorted((r, v) for (m, ll, r), v in vals.items() if ll == l)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style.get(l, "-"), marker="o", label=_name(l))
            if full:
                ax.axhline(full[0], color="black", lw=1, label="full cache")
            ratios = sorted({k[2] for k in vals if k[1] != "full"})
            ax.set_xscale("log")
            ax.set_xticks(ratios, [f"{r:g}" for r in ratios])
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.set_xlabel("keep ratio")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        model = next(iter({k[0] for k in list(nll) + list(needle)}))
        fig.suptitle(f"{model}: end to end with the prompt cache compressed")
        fig.tight_layout()
        path = os.path.join(out_dir, "quality_end_to_end.png")
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description="Print the quality section of bench/RESULTS.md.")
    ap.add_argument("--json", default=DEFAULT_JSON)
    ap.add_argument("--plots", action="store_true", help="also write the PNGs beside the JSON")
    args = ap.parse_args(argv)
    if not os.path.exists(args.json):
        print(f"{args.json} not found: run bench/quality/run.sh first", file=sys.stderr)
        return 2
    with open(args.json, encoding="utf-8") as f:
        doc = json.load(f)
    if args.plots:
        for p in plot(doc, os.path.dirname(os.path.abspath(args.json))):
            print(f"wrote {os.path.relpath(p, ROOT)}", file=sys.stderr)
    print(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
