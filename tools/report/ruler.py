"""RESULTS.md's RULER section, from the JSON lines of bench/ruler/run.py (bench/results/ruler/*.jsonl).

One table per (model, protocol, split), laid out as kvpress's leaderboard: rows are methods, columns
the compression ratios, then the mean over the ratios; niah_multikey_3 apart; the full cache's
score beside; each row's cost as the median, over its runs, of its prefill-and-compression time over
the full row's on the same sample (the recall row adds the archive's scoring and copies, and with two
question passes the question's extra pass; a median, so that a run slowed by other work on the
machine does not move it).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import random
import re
import statistics
import sys
from collections import defaultdict

# Round nine's choice (bench/ruler/README.md), run on held-out seeds 1006-1007 before it becomes the default.
CHOSEN = "flashcache@score.mean_weight=0.75"
CHOSEN_RECALL = "flashcache_recall@score.mean_weight=0.75"
# Round thirteen's choice (on the second dev split), run on held-out seeds 1008-1009; the library's
# default score since 2026-12-07.
FADE_OPTIONS = "score.mean_weight=0.75,score.mean_full_keep=0.5,score.mean_zero_keep=0.25"
# The rows that run the library's default score (the paper's row sets its own). A run whose header records
# other score defaults than the former ones (files before 2026-12-07 record none and ran mean_weight 0) has
# these rows renamed row@<its defaults> on loading, so that rows of different settings never pool.
DEFAULT_ROWS = ("flashcache", "flashcache_recall", "flashcache_tails", "flashcache_model")
FORMER_DEFAULTS = {"score.mean_weight": 0.0, "score.mean_full_keep": 0.0, "score.mean_zero_keep": 0.0}
# Score defaults that headers record since they were added (later than the three above), at the values every
# run had before they were recorded: at these values they name nothing, so rows of runs before and after pool.
UNMOVED_DEFAULTS = {"score.bridge": 0, "score.mean_distance": "kv_squared", "score.gamma": 0.1}
FADED = {row: f"{row}@{FADE_OPTIONS}" for row in DEFAULT_ROWS}  # each of them under the fade
FADE = FADED["flashcache"]
# Round eighteen's choice (gamma 0.05 with KeyDiff's distance, on top of the fade), run on held-out seeds
# 1016-1017 as a candidate of the fade's defaults; the library's default score since 2026-12-08.
R18_OPTIONS = "score.mean_distance=key_cosine,score.gamma=0.05"
R18 = f"flashcache@{FADE_OPTIONS},{R18_OPTIONS}"
R18_RECALL = f"flashcache_recall@{FADE_OPTIONS},{R18_OPTIONS}"
# A row's score settings in its name, in this order (others after them, as they come).
NAME_ORDER = ("score.mean_weight", "score.mean_full_keep", "score.mean_zero_keep", "score.mean_distance",
              "score.gamma")
ORDER = ["flashcache", CHOSEN, FADE, R18, "flashcache_recall", CHOSEN_RECALL, FADED["flashcache_recall"], R18_RECALL,
         "flashcache_tails", FADED["flashcache_tails"], "flashcache_model", FADED["flashcache_model"],
         "flashcache_paper", "kvzip", "expected_attention", "adakv_expected_attention", "snapkv", "keydiff", "tova",
         "knorm", "streaming_llm", "random"]
LABEL = {
    "flashcache": "flashcache (defaults until 2026-12-07, per layer)",
    CHOSEN: "flashcache, mean_weight 0.75 (round nine's choice)",
    FADE: "flashcache, the 0.75 fade (round thirteen's choice; the defaults on 2026-12-07)",
    R18: "flashcache, gamma 0.05 and KeyDiff's distance in the fade (round eighteen's choice; the defaults since "
         "2026-12-08)",
    R18_RECALL: "flashcache + recall, gamma 0.05 and KeyDiff's distance in the fade",
    "flashcache_recall": "flashcache + recall",
    CHOSEN_RECALL: "flashcache + recall, mean_weight 0.75",
    "flashcache_tails": "flashcache + query tails",
    "flashcache_model": "flashcache (dynamic layer budgets)",
    "flashcache_paper": "flashcache (the paper's algorithm)",
    "kvzip": "KVzip",
    "expected_attention": "ExpectedAttention",
    "adakv_expected_attention": "AdaKV-ExpectedAttention",
    "snapkv": "SnapKV",
    "keydiff": "KeyDiff",
    "tova": "TOVA",
    "knorm": "Knorm",
    "streaming_llm": "StreamingLLM",
    "random": "random",
}
LABEL.update({FADED[row]: LABEL[row] + ", the 0.75 fade" for row in DEFAULT_ROWS if row != "flashcache"})
MODEL = {"smollm2": "SmolLM2-135M-Instruct", "gemma3": "Gemma 3 270M"}
TASKS_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "ruler", "tasks.py")


CHOOSE_PY = os.path.join(os.path.dirname(TASKS_PY), "choose.py")


def _module(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def task_count() -> int:
    """How many tasks bench/ruler/tasks.py defines (imported from its path): a complete run has them all."""
    return len(_module("flashcache_ruler_tasks", TASKS_PY).TASKS)


def load(path: str) -> tuple[dict, list[dict]]:
    head, records = {}, []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("header"):
                head = head or r
            else:
                records.append(r)
    defaults = {name: value for name, value in head.get("defaults", FORMER_DEFAULTS).items()
                if name not in UNMOVED_DEFAULTS or UNMOVED_DEFAULTS[name] != value}
    if defaults != FORMER_DEFAULTS:
        for r in records:
            row, _, options = r["row"].partition("@")
            if row not in DEFAULT_ROWS:
                continue
            if not options:
                r["ran_as"] = row  # the name it ran under: a candidate row@option is compared with it
            r["row"] = row + "@" + settings_name(dict(defaults, **parse_settings(options)))
    return head, records


def parse_settings(options: str) -> dict:
    """``score.gamma=0.05,score.mean_distance=key_cosine`` as {name: value}, numbers as floats."""
    out = {}
    for item in filter(None, options.split(",")):
        name, value = item.split("=", 1)
        try:
            out[name] = float(value)
        except ValueError:
            out[name] = value
    return out


def settings_name(settings: dict) -> str:
    """The settings that differ from the former defaults, as a row's name spells them (NAME_ORDER first)."""
    moved = {name: value for name, value in settings.items()
             if FORMER_DEFAULTS.get(name, UNMOVED_DEFAULTS.get(name)) != value}
    names = [n for n in NAME_ORDER if n in moved] + [n for n in moved if n not in NAME_ORDER]
    return ",".join(f"{n}={moved[n]:g}" if isinstance(moved[n], (int, float)) else f"{n}={moved[n]}" for n in names)


def runs(folder: str):
    """(paths, heads, records) of each run in `folder`, in path order: a run is one file, or the parallel
    halves of one (``*_seedsK.jsonl``: the same command on different seeds), read together."""
    groups = defaultdict(list)
    for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
        groups[re.sub(r"_seeds\d+(?=\.jsonl$)", "", path)].append(path)
    for _, paths in sorted(groups.items()):
        loaded = [load(p) for p in paths]
        yield paths, [h for h, _ in loaded], [r for _, rs in loaded for r in rs]


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def table(records: list[dict]) -> list[str]:
    ratios = sorted({r["ratio"] for r in records if r["row"] != "full"})
    samples = {(r["task"], r["seed"], r["length"]) for r in records if r["row"] == "full"}
    if not samples:  # a dev round of candidates: their comparison follows
        return ["No full-cache row in this run (a round of dev candidates, each compared with its row below)."]
    by = defaultdict(list)
    for r in records:
        if (r["task"], r["seed"], r["length"]) in samples:
            by[(r["row"], r["ratio"])].append(r)
    full = by[("full", 0.0)]
    full_time = {(r["task"], r["seed"], r["length"]): r["prefill_s"] for r in full}
    mk3 = [r for r in full if r["task"] == "niah_multikey_3"]
    lines = [f"Full cache: {mean([r['score'] for r in full]):.1f} (niah_multikey_3: "
             f"{mean([r['score'] for r in mk3]):.1f}); {len(samples)} samples "
             f"({len({s[0] for s in samples})} tasks).", "",
             "| method | " + " | ".join(f"{r:g}" for r in ratios) + " | mean | niah_multikey_3 (" +
             " / ".join(f"{r:g}" for r in ratios) + ") | cost (x prefill) |",
             "| --- |" + " ---: |" * (len(ratios) + 3)]
    for row in [r for r in ORDER if any(k[0] == r for k in by)]:
        cells, mk, cost = [], [], []
        complete = True
        for ratio in ratios:
            runs = by.get((row, ratio), [])
            if len({(r["task"], r["seed"], r["length"]) for r in runs}) < len(samples):
                complete = False
            cells.append(mean([r["score"] for r in runs]))
            mk.append(mean([r["score"] for r in runs if r["task"] == "niah_multikey_3"]))
            cost += [(r["prefill_s"] + r["recall_s"]) / full_time[(r["task"], r["seed"], r["length"])] for r in runs]
        mark = "" if complete else " (incomplete)"
        lines.append(f"| {LABEL.get(row, row)}{mark} | " + " | ".join(f"{c:.1f}" for c in cells) +
                     f" | {mean(cells):.1f} | " + " / ".join(f"{c:.0f}" for c in mk) + f" | {statistics.median(cost):.2f} |")
    return lines


def per_task(records: list[dict]) -> list[str]:
    tasks = sorted({r["task"] for r in records})
    rows = [r for r in ["full"] + ORDER if any(x["row"] == r for x in records)]
    lines = ["| method | " + " | ".join(tasks) + " |", "| --- |" + " ---: |" * len(tasks)]
    for row in rows:
        vals = [mean([r["score"] for r in records if r["row"] == row and r["task"] == t]) for t in tasks]
        lines.append(f"| {LABEL.get(row, row)} | " + " | ".join(f"{v:.0f}" for v in vals) + " |")
    return lines


def round_number(path: str) -> int | None:
    """N of a round's file (``*_roundN.jsonl`` or one of its halves, ``*_roundN_seedsK.jsonl``)."""
    match = re.search(r"_round(\d+)(_seeds\d+)?\.jsonl$", os.path.basename(path))
    return int(match.group(1)) if match else None


def candidates(records: list[dict], paths: list[str]) -> list[str]:
    """The dev candidates (rows named base@option=value) beside their base row, on the samples and
    ratios both ran. A later round's files (``*_roundN.jsonl``) are judged as bench/ruler/choose.py
    judges them, by the rule of ``candidates_N.json``; the first round's file lists the comparison."""
    names = sorted({r["row"] for r in records if "@" in r["row"] and "ran_as" not in r})
    if not names:
        return []
    number = round_number(paths[0])
    if number is not None:
        return judged(paths, number)
    score = {(r.get("ran_as", r["row"]), r["task"], r["seed"], r["length"], r["ratio"]): r["score"] for r in records}
    lines = ["Dev candidates (bench/ruler/candidates.json), each beside its row's setting of that run on the "
             "samples and ratios both ran (split.json's rule: bench/ruler/choose.py). The table above shows each "
             "row as it ran (the recall row before 2026-12-05: recall_share 0.5); a candidate that the rule chose "
             "is the setting users get from then on (recall_share 0.25 since 2026-12-05).", "",
             "| candidate | its mean | the row's mean | gain | runs |", "| --- | ---: | ---: | ---: | ---: |"]
    for name in names:
        base = name.split("@")[0]
        keys = [k[1:] for k in score if k[0] == name and (base,) + k[1:] in score]
        if not keys:
            continue
        a = mean([score[(name,) + k] for k in keys])
        b = mean([score[(base,) + k] for k in keys])
        lines.append(f"| `{name}` | {a:.1f} | {b:.1f} | {a - b:+.1f} | {len(keys)} |")
    return lines + [""]


def judged(paths: list[str], number: int) -> list[str]:
    """Round N's candidates with choose.py's verdicts and choice."""
    choose = _module("flashcache_ruler_choose", CHOOSE_PY)
    listed = os.path.join(os.path.dirname(TASKS_PY), f"candidates_{number}.json")
    verdicts, missing = choose.compare(paths, listed)
    if not verdicts:
        return []
    cost = verdicts[0].cost_rule
    rule = ("the cost rule written in that file: not lower by one sample's worth or more, niah_multikey_3 not "
            "lower, and faster" if cost else "split.json's rule: a gain of at least one sample's worth, "
            "niah_multikey_3 not lower")
    with open(listed) as f:
        ratios = choose.rule_ratios(json.load(f))
    named = ", ".join(f"{x:g}" for x in ratios[:-1]) + f" and {ratios[-1]:g}"
    lines = [f"Dev candidates of round {number} (bench/ruler/candidates_{number}.json, listed before "
             f"their run), each beside its row's current setting on the same samples and the rule's ratios {named} "
             f"({rule}; one sample's worth is {verdicts[0].step:.2f} points here; "
             "bench/ruler/choose.py). Time: the candidate's median prefill, compression and recall over the row's.",
             "", "| candidate | its mean | the row's mean | gain | niah_multikey_3 | time | runs | verdict |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for v in verdicts:
        lines.append(f"| `{v.candidate}` | {v.mean:.1f} | {v.base_mean:.1f} | {v.gain:+.2f} | {v.mk3_gain:+.1f} | "
                     f"{v.time_ratio:.2f} | {v.runs} | {'replaces the setting' if v.wins else 'keeps the setting'} |")
    chosen = choose.choices(verdicts)
    lines += ["", "Choice: " + ("; ".join(f"{b} -> `{v.candidate}`" for b, v in sorted(chosen.items()))
                               if chosen else "every row keeps its setting") + "."]
    if missing:
        lines += [f"Not run yet: {', '.join(missing)}."]
    return lines + [""]


def heldout_files(folder: str, model: str, protocol: str):
    """(path, records) of every held-out file of one model and protocol, in path order."""
    for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
        head, records = load(path)
        if (head.get("model"), head.get("protocol"), head.get("split")) == (model, protocol, "heldout"):
            yield path, records


def pooled(folder: str) -> list[str]:
    """SmolLM2's query-agnostic held-out samples at 1,024 tokens, every file pooled: each row's mean per
    ratio over every sample it ran beside the full cache, the issue's goals at a glance. Settings may
    differ between files (the recall row: two question passes until seed 1001, one from seed 1002)."""
    runs = defaultdict(list)  # (row, ratio) -> scores
    samples = defaultdict(set)  # row -> (file, task, seed)
    for path, records in heldout_files(folder, "smollm2", "agnostic"):
        at = [r for r in records if r["length"] == 1024]
        ratios = {r["ratio"] for r in at if r["row"] != "full"}
        full = {(r["task"], r["seed"]) for r in at if r["row"] == "full"}
        have = defaultdict(set)  # (row, task, seed) -> ratios run
        for r in at:
            have[(r["row"], r["task"], r["seed"])].add(r["ratio"])
        for r in at:  # a sample counts for a row once it has run every ratio there (a run in progress)
            if (r["task"], r["seed"]) in full and (r["row"] == "full" or have[(r["row"], r["task"], r["seed"])] == ratios):
                runs[(r["row"], r["ratio"])].append(r["score"])
                samples[r["row"]].add((path, r["task"], r["seed"]))
    if not runs:
        return []
    ratios = sorted({ratio for (row, ratio) in runs if row != "full"})
    lines = ["### SmolLM2-135M-Instruct, agnostic, every held-out sample at 1024 tokens, pooled", "",
             "Each row's mean over every held-out sample it ran (one per task and seed, each file's rows on the "
             "same samples); the samples column counts them. The recall row ran with two question passes on seeds "
             "1000 and 1001 and with one (the default since 2026-12-06) from seed 1002; every other row's settings "
             "are the same in every file. One sample's worth, over 11 tasks and n seeds, is 9.1 / n points.", "",
             f"Full cache: {mean(runs[('full', 0.0)]):.1f} ({len(samples['full'])} samples).", "",
             "| method | " + " | ".join(f"{r:g}" for r in ratios) + " | mean | samples |",
             "| --- |" + " ---: |" * (len(ratios) + 2)]
    for row in [r for r in ORDER if r in samples]:
        cells = [mean(runs.get((row, ratio), [])) for ratio in ratios]
        lines.append(f"| {LABEL.get(row, row)} | " + " | ".join(f"{c:.1f}" for c in cells) +
                     f" | {mean(cells):.1f} | {len(samples[row])} |")
    return lines + [""]


# The goals, each a row against a reference row, per protocol.
GOAL_PAIRS = {
    "agnostic": [("flashcache_recall", "kvzip"), ("flashcache", "keydiff"), ("flashcache", "tova"),
                 ("flashcache", "knorm"), ("flashcache", "streaming_llm"), ("flashcache", "random"),
                 ("flashcache", "expected_attention"), (CHOSEN, "flashcache"), (CHOSEN, "keydiff"), (CHOSEN, "tova"),
                 (CHOSEN_RECALL, "kvzip"), (FADE, "flashcache"), (FADE, "keydiff"), (FADE, "tova"), (FADE, "knorm"),
                 (FADE, "streaming_llm"), (FADE, "random"), (FADE, "expected_attention"), (R18_RECALL, "kvzip"),
                 (R18, FADE), (R18, "keydiff"), (R18, "tova"), (R18, "knorm"), (R18, "streaming_llm"), (R18, "random"),
                 (R18, "expected_attention")],
    "aware": [("flashcache_tails", "snapkv")],
}


def bootstrap_interval(diffs: list[float], reps: int = 4000, seed: int = 0) -> tuple[float, float]:
    """The 95% percentile interval of the mean of `diffs` over resamples of its entries (fixed seed)."""
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(reps))
    return means[int(0.025 * reps)], means[int(0.975 * reps) - 1]


def gaps(folder: str, protocol: str = "agnostic", model: str = "smollm2") -> list[str]:
    """The goals' differences on one model's pooled held-out samples (1,024 tokens, one protocol), each with
    a 95% bootstrap interval over samples: paired, since both rows ran on the same prefill of each sample."""
    score = {}  # (row, ratio, path, task, seed) -> score
    for path, records in heldout_files(folder, model, protocol):
        for r in records:
            if r["length"] == 1024:
                score[(r["row"], r["ratio"], path, r["task"], r["seed"])] = r["score"]
    ratios = sorted({k[1] for k in score if k[0] != "full"})
    lines = []
    for a, b in GOAL_PAIRS[protocol]:
        both = sorted({k[2:] for k in score if k[0] == a} & {k[2:] for k in score if k[0] == b})
        both = [s for s in both if all((row, x) + s in score for row in (a, b) for x in ratios)]
        if not both:
            continue
        cells = []
        for chosen in [[x] for x in ratios] + [ratios]:
            diffs = [mean([score[(a, x) + s] - score[(b, x) + s] for x in chosen]) for s in both]
            lo, hi = bootstrap_interval(diffs)
            cells.append(f"{mean(diffs):+.1f} [{lo:+.1f}, {hi:+.1f}]")
        lines.append(f"| {LABEL.get(a, a)} - {LABEL.get(b, b)} | " + " | ".join(cells) + f" | {len(both)} |")
    if not lines:
        return []
    return [f"The goals' gaps on {MODEL.get(model, model)}'s {protocol} held-out samples at 1024 tokens: the first row's score "
            "minus the second's on the same samples "
            "(paired: both ran on the same prefill), with a 95% bootstrap interval over the samples (4,000 "
            "resamples, seed 0). An interval that holds 0 is a gap these samples cannot tell from none; one "
            "wholly below 0 is a loss they show.", "",
            "| goal | " + " | ".join(f"{x:g}" for x in ratios) + " | mean | samples |",
            "| --- |" + " ---: |" * (len(ratios) + 2)] + lines + [""]


def render(folder: str) -> str:
    parts = ["## RULER-style tasks beside kvpress's presses", "",
             "Tasks generated locally from the RULER paper's definitions (bench/ruler, its README), every row "
             "through kvpress's own pipeline on the same model and tokens; score: RULER's string_match_all x 100, "
             "mean over tasks and samples. Ratios are kvpress's compression ratios (the share of the cache "
             "removed; cells kept per head: max(1, int(N (1 - ratio)))). The recall row keeps fewer cells at "
             "compression and brings back up to the difference, so it never holds more than the others at the "
             "answer. Cost: the row's prefill and compression time (and, for recall, what the recall adds: the "
             "archive's scoring and copies, and with two question passes, the default until seed 1001, the "
             "question's extra pass) over the full cache's prefill, on this CPU.", ""]
    parts += pooled(folder) + gaps(folder) + gaps(folder, "aware") + gaps(folder, "aware", "gemma3")
    tasks = task_count()
    for paths, heads, records in runs(folder):
        if not records:
            continue
        head = heads[0]
        name = MODEL.get(head.get("model"), head.get("model"))
        lengths = sorted({r["length"] for r in records})
        # A task is complete when it has every (row, ratio) the file has for any task.
        pairs = {(r["row"], r["ratio"]) for r in records if "@" not in r["row"]}
        have = defaultdict(set)
        for r in records:
            have[r["task"]].add((r["row"], r["ratio"]))
        done = {t for t, p in have.items() if pairs <= p}
        number = round_number(paths[0])
        parts += [f"### {name}, {head.get('protocol')}, {head.get('split')} samples, "
                  f"{'/'.join(str(n) for n in lengths)} tokens"
                  f"{f', candidate round {number}' if number is not None else ''}", ""]
        for h in heads:
            parts += [f"`{h.get('command')}` ({h.get('date')}, {h.get('cpus')} CPUs, {h.get('machine')}, "
                      f"git {h.get('git')}; kvpress {h.get('versions', {}).get('kvpress')}, "
                      f"transformers {h.get('versions', {}).get('transformers')}).", ""]
        if len(heads) > 1:
            parts += ["Its parallel halves (the same command on different seeds), read together.", ""]
        if head.get("model") == "gemma3":
            parts += ["Every row compresses Gemma 3's 3 global layers of 18, kvpress's own rule for Gemma 3; the "
                      "sliding-window layers keep their 512 positions (bench/ruler/README.md), and the ratio is the "
                      "global layers'. kvpress 0.5.5 cannot run KVzip (it refuses Gemma3ForCausalLM) or "
                      "ExpectedAttention (its statistics call Gemma 3's rotary embedding without a layer type) on "
                      "this model: those rows are missing.", ""]
        if len(done) < tasks:  # a run that stopped part way (it resumes from its lines)
            parts += [f"**In progress: {len(done)} of the {tasks} tasks have every row; the means below are "
                      "over those tasks only, not comparable with a complete table.**", ""]
            records = [r for r in records if r["task"] in done]
        parts += table(records) + ["", "Per task, mean over the ratios:", ""] + per_task(records) + [""]
        parts += candidates(records, paths)
    return "\n".join(parts)


if __name__ == "__main__":
    print(render(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..",
                                                                      "bench", "results", "ruler")))
