"""Markdown section for the CPU speed benchmarks (Google Benchmark JSON)."""
import json
import re
import sys


def _runs(doc):
    """Benchmarks by name, without aggregates, times in ms."""
    out = {}
    for b in doc["benchmarks"]:
        if b.get("run_type") == "aggregate":
            continue
        scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
        b["ms"] = b["real_time"] * scale
        out[b["name"]] = b
    return out


def _args(name):
    return dict(re.findall(r"(\w+):(\d+)", name))


def _gbs(b):
    return b.get("bytes_per_second", 0.0) / 1e9


def render(doc, command):
    runs = _runs(doc)
    ctx = doc["context"]
    lines = [
        "## CPU speed",
        "",
        f"Machine: {ctx.get('num_cpus')} x {ctx.get('mhz_per_cpu')} MHz CPU, "
        f"L2 {next((c['size'] // 1024 for c in ctx.get('caches', []) if c['level'] == 2), '?')} KiB; "
        f"date {ctx.get('date')}; command `{command}`. "
        "Times are per layer (score + select + gather at keep ratio 0.2, bf16 input); the whole model "
        "costs layers x that, since every layer is independent. Bytes moved = K and V read once plus the "
        "compact cache written; the copy row moves the same K and V bytes (read + write) in the same run.",
        "",
        "| model | tokens | policy | ms / layer | ms / model | GB/s | share of copy GB/s |",
        "|---|---|---|---|---|---|---|",
    ]
    layers = {"0": 28, "1": 30}
    names = {"0": "Qwen2.5-VL-7B", "1": "SmolLM2-135M"}
    rows = [("BM_Copy", "copy (reference)"), ("BM_FlashCacheGlobal", "FlashCache defaults (global, peak base)"),
            ("BM_FlashCacheGlobalLowpass", "FlashCache global, low-pass base (the paper's)"),
            ("BM_FlashCacheBlocked", "FlashCache blocked, low-pass base"), ("BM_StreamingLLM", "StreamingLLM"),
            ("BM_KNorm", "K-norm"), ("BM_SnapKV", "SnapKV (32 queries)"), ("BM_H2O", "H2O")]
    for model in ("0", "1"):
        for tokens in ("2048", "4096", "8192", "32768"):
            copy = runs.get(f"BM_Copy/model:{model}/tokens:{tokens}")
            for prefix, label in rows:
                b = runs.get(f"{prefix}/model:{model}/tokens:{tokens}") or runs.get(
                    f"{prefix}/model:{model}/tokens:{tokens}/iterations:1")
                if not b:
                    continue
                share = f"{_gbs(b) / _gbs(copy):.3f}" if copy else "-"
                lines.append(f"| {names[model]} | {tokens} | {label} | {b['ms']:.3f} | "
                             f"{b['ms'] * layers[model]:.1f} | {_gbs(b):.2f} | {share} |")
    lines += ["", "Scoring cost as tokens, head dim and heads grow (one layer, float work on bf16 input):", "",
              "| transform | tokens | head dim | heads | ms | ms per (token x dim x head) x 1e6 |", "|---|---|---|---|---|---|"]
    labels = {"BM_ScoreGlobal": "global, peak (defaults)", "BM_ScoreGlobalLowpass": "global, low-pass",
              "BM_ScoreBlocked": "blocked, low-pass"}
    for prefix, label in labels.items():
        for name, b in runs.items():
            if name.startswith(prefix + "/"):
                a = _args(name)
                work = int(a["tokens"]) * int(a["head_dim"]) * int(a["heads"])
                lines.append(f"| {label} | {a['tokens']} | {a['head_dim']} | {a['heads']} | "
                             f"{b['ms']:.2f} | {b['ms'] / work * 1e6:.3f} |")
    lines += ["", "Other stages:", "", "| stage | size | time |", "|---|---|---|"]
    for name, b in runs.items():
        if name.startswith(("BM_Select/", "BM_Gather/", "BM_Allocate/")):
            lines.append(f"| {name.split('/')[0][3:].lower()} | {name.split('/', 1)[1]} | {b['ms'] * 1e3:.1f} us |")
    lines += ["", "Decode attention, one layer of Qwen2.5-VL-7B (28 query heads, 4 KV heads, d 128), one query "
              "token per sequence, bf16 cache; speed-up is against the full cache in the same run:", "",
              "| batch | tokens | cache | KV MiB | ms | speed-up |", "|---|---|---|---|---|---|"]
    for name, b in runs.items():
        if name.startswith("BM_DecodeAttention/"):
            a = _args(name)
            full = runs[f"BM_DecodeAttention/batch:{a['batch']}/tokens:{a['tokens']}/keep_permille:1000"]
            keep = int(a["keep_permille"])
            label = "full" if keep == 1000 else f"keep {keep / 1000:.1f}"
            lines.append(f"| {a['batch']} | {a['tokens']} | {label} | {b['cache_MiB']:.0f} | {b['ms']:.2f} | "
                         f"{full['ms'] / b['ms']:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(render(json.load(f), sys.argv[2] if len(sys.argv) > 2 else "bench_cpu"))
