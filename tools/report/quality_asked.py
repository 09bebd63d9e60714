"""Markdown section for passkeys asked after compression, with and without recall
(bench/quality/asked_eval.py): the dev study's choice (quality_long_asked_choice.json, written by
bench/quality/study/choose_asked.py) and the held-out run (quality_long_asked_heldout.json). Every
number comes from the JSON."""
import collections
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "results")
BASE_ROWS = ("full", "defaults", "paper", "query-tail", "snapkv", "h2o", "kvzip")


def _load(name):
    path = os.path.join(RESULTS, name)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _table(doc, labels):
    """Rows: labels; columns: each run template at keep 0.1 / 0.2, then the totals."""
    hits, share = collections.defaultdict(int), {}
    ratios = doc["header"]["keep_ratios"]
    templates = [t for t in doc["header"]["templates"] if doc["header"]["templates_run"][t].get("length")]
    for r in doc["records"]:
        key = (r["label"], r["template"], r["keep_ratio"])
        if r["metric"] == "passkey_hits":
            hits[key] += r["value"]
        elif r["metric"] == "needle_kept_share":
            share[key] = r["value"]
    head = "| row | " + " | ".join(f"{t} @" + " / @".join(f"{x:g}" for x in ratios) for t in templates) + \
        " | " + " | ".join(f"all @{x:g}" for x in ratios) + " | needle held @" + " / @".join(f"{x:g}" for x in ratios) + " |"
    lines = [head, "|" + "---|" * (len(templates) + len(ratios) + 2)]
    n = doc["header"]["trials"]
    for label in labels:
        if label == "full":
            cells = [str(hits[("full", t, 1.0)]) for t in templates]
            total = sum(hits[("full", t, 1.0)] for t in templates)
            lines.append("| full | " + " | ".join(cells) + " | " + " | ".join(
                f"{total} of {n * len(templates)}" for _ in ratios) + " | 1 |")
            continue
        cells = [" / ".join(str(hits[(label, t, x)]) for x in ratios) for t in templates]
        totals = [f"{sum(hits[(label, t, x)] for t in templates)}" for x in ratios]
        held = " / ".join(f"{sum(share.get((label, t, x), 0) for t in templates) / len(templates):.2f}" for x in ratios)
        lines.append(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(totals) + f" | {held} |")
    return lines


def _goals(doc, recall_rows):
    """The asked-later study's goals, as measured: per template within 1 key of the full cache; the multi-turn one at 4 of 5."""
    hits = collections.defaultdict(int)
    for r in doc["records"]:
        if r["metric"] == "passkey_hits":
            hits[(r["label"], r["template"], r["keep_ratio"])] += r["value"]
    run = {t: e for t, e in doc["header"]["templates_run"].items() if e.get("length")}
    out = []
    for label in recall_rows:
        parts = []
        for x in doc["header"]["keep_ratios"]:
            near = [t for t in run if hits[(label, t, x)] >= hits[("full", t, 1.0)] - 1]
            far = sorted(set(run) - set(near))
            parts.append(f"at keep {x:g}, {len(near)} of {len(run)} templates within 1 key of the full cache"
                         + (f" (not: {', '.join(far)})" if far else ""))
        multi = [t for t, e in run.items() if e.get("kind") == "multi_turn"]
        turns = "; ".join(f"the multi-turn template `{t}`: " + " / ".join(
            str(hits[(label, t, x)]) for x in doc["header"]["keep_ratios"]) + " of 5" for t in multi)
        out.append(f"Goals of the asked-later study, `{label}`: " + "; ".join(parts) + (f"; {turns} (goal: 4)." if turns else "."))
    return out


def render(choice):
    dev, held = _load("quality_long_asked_dev.json"), _load("quality_long_asked_heldout.json")
    lines = ["## Passkeys asked after compression, with recall (SmolLM2-135M, 30 layers)", "",
             "Rule: [`bench/quality/study/ASKED_RULE.md`](quality/study/ASKED_RULE.md), written before the first "
             "run. The context (the passkey prompt without its question) is prefilled and compressed; the question "
             "then comes as a new turn, decoded over the compressed cache; the recall rows score the evicted tokens "
             "with its queries (`flashcache recall`), add what comes back and decode the question again; 8 greedy "
             "tokens answer. No row sees the question before it compresses. Prompts of about 1,024 tokens, 5 "
             "trials per template. `needle held`: the share of the key's tokens in the cache when the answer is "
             "generated (kept plus recalled), over layers and KV heads.", ""]
    if dev:
        h = dev["header"]
        lines += [f"Dev: `{h['how']}` on {h['when']}, git {str(h['git'])[:12]}, {h['seconds']:.0f} s.", "",
                  "Step 1 (per head, exact, redo the whole question), dev hits over both keep ratios and every "
                  "dev template:", "",
                  "| R (tokens per head) \\ block | " + " | ".join(f"b{b}" for b in (8, 16, 32)) + " |",
                  "|---|---|---|---|"]
        for r in (16, 32, 64):
            lines.append(f"| {r} | " + " | ".join(
                f"{choice['hits'].get(f'recall-{r}-b{b}', '-')} (shared {choice['hits'].get(f'recall-{r}-b{b}-shared', '-')}, "
                f"last {choice['hits'].get(f'recall-{r}-b{b}-last', '-')}, digest "
                f"{choice['hits'].get(f'recall-{r}-b{b}-digest', '-')})" for b in (8, 16, 32)) + " |")
        lines += ["", f"Step 1 chose **{choice['step1']}**; step 2: " + "; ".join(
            f"{s['variant']} {s['hits']} against {s['against']}, {'taken' if s['taken'] else 'not taken'}"
            for s in choice["step2"]) + f". The choice: **{choice['choice']}**.", "",
                  "Dev, every base row and the choice's step-1 row:", ""]
        lines += _table(dev, list(BASE_ROWS) + [choice["step1"]] + [s["variant"] for s in choice["step2"]])
        skipped = [t for t, e in h["templates_run"].items() if not e.get("length")]
        if skipped:
            lines += ["", "Left out (the full cache misses more than one key at 1,024 tokens in this protocol): "
                      + ", ".join(f"`{t}`" for t in skipped) + "."]
    if held:
        h = held["header"]
        recall_rows = [r["label"] for r in h["rows"] if r.get("label", "").startswith("recall-")]
        lines += ["", f"Held-out, run once with the choice made: `{h['how']}` on {h['when']}, git "
                  f"{str(h['git'])[:12]}, {h['seconds']:.0f} s.", ""]
        lines += _table(held, list(BASE_ROWS) + recall_rows)
        lines += [""] + _goals(held, recall_rows)
        skipped = [t for t, e in h["templates_run"].items() if not e.get("length")]
        if skipped:
            lines += ["", "Left out (the full cache misses more than one key at 1,024 tokens in this protocol): "
                      + ", ".join(f"`{t}`" for t in skipped) + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(_load("quality_long_asked_choice.json")))
