"""Markdown section for the chosen score's per-layer cost at smooth and awkward prompt lengths,
from the generic build and the native one (bench/results/cpu_simd.json, written by
bench/run_simd.sh). Every number comes from the JSON."""


def _medians(gbench):
    """{(benchmark, tokens): median real time in ms} of a Google Benchmark JSON."""
    out = {}
    for b in gbench["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name, _, tokens = b["run_name"].partition("/tokens:")
        scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
        out[(name, int(tokens))] = b["real_time"] * scale
    return out


def render(doc):
    gen, nat = _medians(doc["generic"]), _medians(doc["native"])
    ctx = doc["generic"].get("context", {})
    lines = ["## The chosen score per layer: prompt lengths and SIMD", "",
             f"Command `{doc['command']}`; date {doc['date']}; {ctx.get('num_cpus', '?')} CPUs at "
             f"{ctx.get('mhz_per_cpu', '?')} MHz, one thread. One SmolLM2-135M layer (9 query heads over 3 KV "
             "heads, head dim 64): `BM_QueryTail` (the tails of the prompt's last 256 queries, the chosen "
             "feed) and `BM_ScoreSmolLayer` (the query-free score of the same layer; the chosen score is the "
             "two together plus a mix that costs little). Generic: " + doc["flags"]["generic"] + "; native: " +
             doc["flags"]["native"] + ". Medians of 3 repetitions. 3,678 = 2 x 3 x 613, and 4,099 and 8,191 "
             "are prime: the global transform takes Bluestein's algorithm there. `BM_CopySmolLayer` copies "
             "the same layer's K and V bytes: the floor of any pass over them; x copy is the score's time over "
             "the copy's (generic build). Smooth / this: the score per token at this length over the mean of the "
             "smooth lengths' (2,048, 4,096, 8,192, 16,384).", "",
             "| tokens | tails, generic ms | tails, native ms | native / generic | score, generic ms | "
             "score, native ms | native / generic | score generic, us per token | x copy | this / smooth |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    smooth = [gen[("BM_ScoreSmolLayer", t)] / t for t in (2048, 4096, 8192, 16384) if ("BM_ScoreSmolLayer", t) in gen]
    per_smooth = sum(smooth) / len(smooth) if smooth else None
    for tokens in sorted({t for (_, t) in gen}):
        tg, tn = gen.get(("BM_QueryTail", tokens)), nat.get(("BM_QueryTail", tokens))
        sg, sn = gen.get(("BM_ScoreSmolLayer", tokens)), nat.get(("BM_ScoreSmolLayer", tokens))
        def f(x):
            return "-" if x is None else f"{x:.2f}"
        def r(a, b):
            return "-" if a is None or b is None else f"{b / a:.2f}"
        copy = gen.get(("BM_CopySmolLayer", tokens))
        lines.append(f"| {tokens:,} | {f(tg)} | {f(tn)} | {r(tg, tn)} | {f(sg)} | {f(sn)} | {r(sg, sn)} | "
                     f"{'-' if sg is None else f'{1000 * sg / tokens:.2f}'} | {r(copy, sg) if copy else '-'} | "
                     f"{'-' if sg is None or per_smooth is None else f'{sg / tokens / per_smooth:.2f}'} |")
    lines.append("")
    return "\n".join(lines)
