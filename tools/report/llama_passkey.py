"""Markdown section for the passkey templates through llama.cpp (bench/results/llama_passkey.json,
written by bench/stream/run_passkey_llama.py), SmolLM2 and Gemma 3 side by side, with SmolLM2's
held-out numpy rows (bench/results/quality_long_passkey.json) beside them. Every number comes from
the JSON files."""
import collections
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "results")
LABELS = {"full": "full cache", "flashcache": "FlashCache defaults", "paper": "the paper's algorithm",
          "query-tail": "defaults + query tails", "streaming": "StreamingLLM (sink 4)"}
# The numpy table's rows that match: one keep-set per sequence (flashcache-seq) is what llama.cpp's cells hold.
NUMPY_ROW = {"full": "full", "flashcache": "flashcache-seq", "paper": "flashcache-paper", "query-tail": None,
             "streaming": "streaming"}


def _numpy_heldout():
    path = os.path.join(RESULTS, "quality_long_passkey.json")
    if not os.path.exists(path):
        return None, 0
    with open(path, encoding="utf-8") as f:
        recs = json.load(f)["records"]
    hits, templates = collections.Counter(), set()
    for r in recs:
        if r.get("metric") == "passkey_hits" and r["split"] == "heldout":
            hits[(r["label"], r["keep_ratio"])] += r["value"]
            templates.add(r["template"])
    return hits, len(templates)


def render(doc):
    models = list(doc["models"])
    ratios = sorted({float(n.split("@")[1]) for n in doc["rows"] if "@" in n})
    ran = {m: [t for t in doc["templates"] if t["model"] == m and not t.get("skipped")] for m in models}
    skipped = {m: [t for t in doc["templates"] if t["model"] == m and t.get("skipped")] for m in models}
    numpy_hits, numpy_templates = _numpy_heldout()

    def total(m, name):
        """Keys found over the templates where the row ran, as a table cell (and those that refused it)."""
        vals = [t["hits"][name] for t in ran[m]]
        done = [v for v in vals if v is not None]
        if not done:
            return "refused"
        cell = f"{sum(done)} / {5 * len(done)}"
        return cell + (f" ({len(vals) - len(done)} refused)" if len(done) < len(vals) else "")

    head = ["row"]
    for m in models:
        head += [f"{m}: keep {r:g}" for r in ratios]
    if numpy_hits:
        head += [f"smollm2 numpy: keep {r:g}" for r in ratios]
    lines = ["## The passkey templates through llama.cpp: SmolLM2 and Gemma 3", "",
             f"Command `{doc['command']}`; date {doc['date']}; {doc['machine']['cpus']} CPUs, {doc['threads']} "
             f"threads. The held-out templates of `{doc['split'].split(' ')[0]}`, 5 trials each, by the rule "
             f"`{doc['rule']}` (written before the run; nothing chosen): each prompt is prefilled once by "
             "`flashcache_policies`, every row made from that state, and the key must appear in "
             f"{doc['answer_tokens']} greedy tokens. Lengths, the longest where the full cache finds 4 of 5: "
             + "; ".join(f"{doc['models'][m]['name']}: " +
                         ", ".join(f"{t['template']} {t['length']:,}" for t in ran[m]) for m in models) + ".", ""]
    short = [f"{t['template']} on {t['model']} ({', '.join(f'{n:,}' for n in t['filler_too_short_for'])})"
             for t in doc["templates"] if t.get("filler_too_short_for")]
    if short:
        lines += ["Lengths a template's filler text cannot reach, skipped for it (the rule's addendum): " +
                  "; ".join(short) + " tokens.", ""]
    for m in models:
        if skipped[m]:
            lines += [f"Skipped on {m} (the full cache found fewer than 4 of 5 at every length): " +
                      ", ".join(f"{t['template']} ({', '.join(f'{k}: {v}' for k, v in t['full_cache_hits'].items())})"
                                for t in skipped[m]) + ".", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for policy in LABELS:
        cells = [LABELS[policy]]
        for m in models:
            for r in ratios:
                cells.append(total(m, "full" if policy == "full" else f"{policy}@{r:g}"))
        if numpy_hits:
            ref = NUMPY_ROW[policy]
            for r in ratios:
                cells.append("-" if ref is None else
                             f"{numpy_hits[(ref, 1.0 if policy == 'full' else r)]} / {5 * numpy_templates}")
        lines.append("| " + " | ".join(cells) + " |")
    refusals = {f"{m} {name}": msg for m in models for t in ran[m] for name, msg in t["refused"].items()}
    if refusals:
        lines += ["", "Refused by name (at 4,096 tokens keep 0.1 cannot hold the protected sliding window): " +
                  "; ".join(f"{k}: \"{v}\"" for k, v in sorted(refusals.items())[:2]) +
                  (f"; and {len(refusals) - 2} more" if len(refusals) > 2 else "") + "."]
    if numpy_hits:
        lines += ["", "The numpy columns are SmolLM2's held-out table (`quality_long_passkey.json`: numpy forward "
                  "pass, one keep-set per sequence for the defaults' row as here), at its own lengths."]
    return "\n".join(lines) + "\n"
