"""Markdown section for the second model family (bench/results/llama_second_model.json, written by
bench/stream/run_second_model.py), beside SmolLM2's held-out rows of the same protocols
(bench/results/llama_stream.json). Every number comes from the JSON."""
import collections
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "results")
# SmolLM2's rows of llama_stream.json that match this section's rows (its defaults ran without recall).
SMOLLM2_ROW = {"full": "full", "shift": "shift", "streaming": "streaming",
               "flashcache defaults": "flashcache target 0.75, window 0.9"}


def _smollm2():
    path = os.path.join(RESULTS, "llama_stream.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def render(doc):
    small = _smollm2()
    ref_stream = {(r["cells"], r["label"]): r for r in small["streams"] if r["split"] == "heldout"} if small else {}
    ref_facts = collections.Counter()
    if small:
        for r in small["facts"]:
            if r["split"] == "heldout":
                ref_facts[r["label"]] += r["hit"]
    facts = collections.Counter()
    for r in doc["facts"]:
        facts[r["label"]] += r["hit"]
    lines = ["## A second model family: Gemma 3 270M through llama.cpp (sliding-window attention)", "",
             f"Command `{doc['command']}`; date {doc['date']}; {doc['machine']['cpus']} CPUs, {doc['threads']} "
             f"threads; model {doc['model']}. The held-out text and filler of `{doc['split_file']}` in the "
             "protocols of the bounded-context benchmark above, with no new tuning: FlashCache runs with "
             "`flashcache_chat`'s defaults (chosen on SmolLM2) without recall, as SmolLM2's rows here, and only "
             "the 3 global layers of 18 are compacted (the sliding layers keep their 512-position window). "
             f"Streams: the first {doc['max_tokens']:,} tokens, the NLL of the tokens after the first `cells`. "
             "Facts: a 6-digit code at five depths, asked at the end, through 1,024 cells (the full cache: "
             "4,096). SmolLM2's columns are its held-out rows of the same protocols.", "",
             "| cells | row | Gemma 3: stream NLL | avg cells | events | SmolLM2: stream NLL | avg cells |",
             "|---|---|---|---|---|---|---|"]
    for r in doc["streams"]:
        ref = ref_stream.get((r["cells"], SMOLLM2_ROW.get(r["label"], "")))
        lines.append(f"| {r['cells']:,} | {r['label']} | {r['stream_nll']:.4f} | {r['avg_cells']:.0f} | {r['events']} | "
                     + (f"{ref['stream_nll']:.4f} | {ref['avg_cells']:.0f} |" if ref else "- | - |"))
    lines += ["", "| row | Gemma 3: facts found | SmolLM2: facts found |", "|---|---|---|"]
    for label in doc["rows"]:
        n = sum(1 for r in doc["facts"] if r["label"] == label)
        ref = SMOLLM2_ROW.get(label)
        lines.append(f"| {label} | {facts[label]} of {n} | " + (f"{ref_facts[ref]} of 5 |" if small and ref else "- |"))
    if doc.get("asked"):
        lines += _asked(doc)
    return "\n".join(lines) + "\n"


def _asked(doc):
    """The facts asked later (run_recall.py's protocol), beside SmolLM2's held-out ones: llama_recall.json's
    rows, and for the recall row the position-ordered archive (llama_recall_order.json), the chat's default."""
    hits = collections.Counter()
    for r in doc["asked"]:
        hits[r["label"]] += r["hit"]
    ref = collections.Counter()
    path = os.path.join(RESULTS, "llama_recall.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for r in json.load(f)["facts"]:
                if r["split"] == "heldout":
                    ref[r["label"]] += r["hit"]
    order_path = os.path.join(RESULTS, "llama_recall_order.json")
    recall_label = next((l for l in doc["asked_rows"] if l.startswith("flashcache + archive")), None)
    if os.path.exists(order_path) and recall_label:
        with open(order_path, encoding="utf-8") as f:
            ref[recall_label] = json.load(f)["position"]["heldout_facts"]
    ev = [r["recall_event"] for r in doc["asked"] if r.get("recall_event")]
    lines = ["", "The same facts asked later: the filler streamed through 1,024 cells, then the question as a new "
             "turn (`--ask`), 12 tokens generated (run_recall.py's protocol).", "",
             "| row | Gemma 3: facts found | SmolLM2: facts found |", "|---|---|---|"]
    for label in doc["asked_rows"]:
        n = sum(1 for r in doc["asked"] if r["label"] == label)
        lines.append(f"| {label} | {hits[label]} of {n} | {ref[label] if ref else '-'} of 5 |")
    if ev:
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        lines += ["", f"Recall on Gemma 3 (medians over the {len(ev)} questions): {med([e['recalled'] for e in ev])} cells "
                  f"back, scoring {med([e['score_ms'] for e in ev]):.0f} ms, writing {med([e['write_ms'] for e in ev]):.0f} "
                  f"ms, decoding the turn again {med([e['redo_ms'] for e in ev]):.0f} ms against its own first decode "
                  f"of {med([e['turn_decode_ms'] for e in ev]):.0f} ms."]
    return lines


if __name__ == "__main__":
    with open(os.path.join(RESULTS, "llama_second_model.json"), encoding="utf-8") as f:
        print(render(json.load(f)))
