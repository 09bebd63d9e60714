"""Markdown section for the static GPU report (bench/results/static_sm90.json,
written by bench/gpu/static_report.sh): what the compiler says about each
kernel for sm_90, and the bytes-and-FLOPs model. Nothing here was measured on
a GPU, and the section says so."""
import json
import sys


def _short(name):
    """'void kernels::score_blocked_kernel<float, 128, 64>(...)' -> 'score_blocked_kernel<float, 128, 64>'."""
    name = name.split("(")[0].replace("void ", "").replace("kernels::", "").replace("flashcache::", "")
    return name.replace("<0>", "")


def _ms(seconds):
    return "%.3f" % (seconds * 1e3) if seconds is not None else "n/a"


def render(doc):
    m = doc["model"]
    c = m["constants"]
    lines = [
        "## GPU kernels, static view (sm_90, no GPU)",
        "",
        "From `bench/gpu/static_report.sh` (%s): ptxas resource usage of every kernel instantiation "
        "`compress_async` launches (and `query_tails_async`, at head dim 128), and the CTAs per SM it "
        "allows on sm_90 (registers, warps, shared memory "
        "with 1 KB reserved per CTA, at most 32 CTAs). Dynamic shared memory of the blocked scorer is for "
        "`block_size` equal to its tile and gamma %g. **Not measured:** no GPU ran this." % (
            doc.get("compiler", "nvcc"), c["gamma"]),
        "",
        "| kernel | threads | registers | spill bytes | shared bytes | CTAs/SM | limited by |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for k in doc["kernels"]:
        lines.append("| `%s` | %s | %d | %d | %d | %s | %s |" % (
            _short(k["name"]), k.get("threads") or "", k.get("registers", 0), k.get("spill_bytes", 0),
            k.get("shared_bytes", 0), k.get("ctas_per_sm", ""), k.get("occupancy_limit", "")))
    step = doc.get("blocked_step")
    lines.append("")
    if step:
        lines.append("Blocked scorer's frequency step (`%s`): **%d SASS instructions** per step and column, "
                     "of which %d FFMA, %d shared loads, %d other." % (
                         doc["blocked_step_kernel"], step["instructions"], step["ffma"], step["shared_loads"],
                         step["other"]))
    else:
        lines.append("Blocked scorer's frequency step: no SASS (cuobjdump unavailable).")
    b, g = m["blocked"], m["global"]
    lines += [
        "",
        "Model, Qwen2.5-VL-7B cache at %d tokens (%d layers, %d KV heads, head dim %d, bf16: %.0f MB of K and V), "
        "keep %g, on an H200: HBM %.1f TB/s, FP32 %.0f TFLOP/s, %d SMs x %d warp instructions per clock at "
        "%.2f GHz, %.0f us per launch. Estimate: the largest of memory, FP32 and instruction-issue time, plus launches:" % (
            c["tokens"], c["layers"], c["kv_heads"], c["head_dim"], m["kv_bytes"] / 1e6, c["keep_ratio"],
            c["hbm_bytes_per_s"] / 1e12, c["fp32_flops_per_s"] / 1e12, c["sms"],
            c["warp_issue_per_sm_per_clock"], c["clock_hz"] / 1e9, c["launch_s"] * 1e6),
        "",
        "| path | bytes (MB) | memory (ms) | FP32 (ms) | issue (ms) | launches | estimate (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|",
        "| blocked (block %d, m = %d) | %.0f | %s | %s | %s | %d | %s |" % (
            c["block_size"], m["frequencies_per_block"], b["bytes"] / 1e6, _ms(b["memory_s"]), _ms(b["fp32_s"]),
            _ms(b.get("issue_s")), b["launches"], _ms(b["estimate_s"])),
        "| global (cuFFT) | %.0f | %s | %s | | %d | %s |" % (
            g["bytes"] / 1e6, _ms(g["memory_s"]), _ms(g["fp32_s"]), g["launches"], _ms(g["estimate_s"])),
        "",
        "Goal for the blocked path: %s ms." % _ms(m["goal_blocked_s"]),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    with open(sys.argv[1] if len(sys.argv) > 1 else "bench/results/static_sm90.json") as f:
        print(render(json.load(f)))
