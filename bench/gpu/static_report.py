"""Static view of the GPU kernels for sm_90, from the compiler alone (no GPU).

Reads what `nvcc -Xptxas -v` printed for bench/gpu/static_kernels.cu and,
when given, the SASS of the same cubin (cuobjdump -sass); writes JSON:
  kernels: per instantiation registers, spills, static and dynamic shared
           memory, threads per CTA and the CTAs per SM they allow on sm_90;
  blocked_step_*: SASS instructions in the blocked scorer's frequency step
           (float, head dim 128, 64-token tiles), FFMAs among them;
  model:   a bytes-and-FLOPs estimate of compressing the Qwen2.5-VL-7B cache
           at 8K tokens on an H200, every constant named.
Run by bench/gpu/static_report.sh; tools/report/static_gpu.py renders it.
"""
import argparse
import json
import math
import re
import subprocess
import sys

# ---- sm_90 limits (CUDA C Programming Guide, compute capability 9.0) ----------
SM90 = {
    "registers_per_sm": 65536,
    "register_alloc_unit_per_warp": 256,
    "max_warps_per_sm": 64,
    "max_ctas_per_sm": 32,
    "shared_bytes_per_sm": 233472,  # 228 KB
    "shared_reserved_per_cta": 1024,
}

# Threads per CTA of each kernel, as compress.cuh launches them.
THREADS = {
    "sequence_table_kernel": 256, "blocked_edges_kernel": 256, "finite_kernel": 256, "substitute_kernel": 256,
    "check_lengths_kernel": 256, "pack_kernel": 256, "lowpass_kernel": 256, "residual_kernel": 256,
    "energy_kernel": 128, "allocate_kernel": 256, "select_kernel": 256, "gather_kernel": 256,
    "compact_paged_kernel": 256, "page_owner_kernel": 256, "score_grid_kernel": 256, "base_sample_kernel": 256,
    "base_energy_kernel": 256, "base_choose_kernel": 256, "chosen_base_kernel": 256,
    "mix_tails_kernel": 256, "query_tails_kernel": 128,
}
ELEMENT_BYTES = {"float": 4, "flashcache::half_t": 2, "flashcache::bfloat16_t": 2}


def align16(x):
    return (x + 15) // 16 * 16


def lowpass_cutoff(n, gamma):
    m = math.ceil(gamma * n - 1e-9)
    return max(1, min(n, m))


def blocked_smem(head_dim, elem_bytes, tile, max_m, threads):
    """BlockedSmem in flashcache/cuda/kernels/score_blocked.cuh, line for line."""
    warps = threads // 32
    tile_bytes = align16(tile * head_dim * elem_bytes)
    ext_bytes = align16(head_dim * elem_bytes)
    at = 2 * tile_bytes + 2 * ext_bytes
    at += align16(max_m * tile * 4)
    at += 2 * align16(warps * tile * 4)
    at += 2 * align16(tile * 4)
    at += align16(threads * 4 * 4)
    return at + 16 * 4


def grid_zone(tr, tc, gamma):
    """U and V(0) of a tr x tc tile's triangle zone (rules::in_grid_zone)."""
    s = math.sqrt(2 * gamma) - 1e-9
    u = 1 + sum(1 for i in range(1, tr) if i / tr < s)
    v = 1 + sum(1 for j in range(1, tc) if j / tc < s)
    return u, v


def grid_smem(tr, tc, head_dim, gamma, threads=256, preferred=48 * 1024, max_width=64):
    """GridSmem in flashcache/cuda/kernels/score_grid.cuh and the width size_grid_launch picks, line for line."""
    u, v = grid_zone(tr, tc, gamma)
    tokens = tr * tc

    def total(w):
        xs = w if w % 2 else w + 1
        at = align16(u * tr * 4) + align16(v * tc * 4) + align16(tr * 4) + align16(tokens * 4)
        at += align16(2 * tokens * xs * 4) + align16(2 * u * tc * w * 4) + align16(2 * u * v * w * 4)
        at += align16(2 * tokens * 4) + align16(2 * threads * 4)
        return at + 16 * 4

    width = min(max_width, head_dim)
    while width > 1 and total(width) > preferred:
        width //= 2
    chunks = -(-head_dim // width)
    width = -(-head_dim // chunks)
    return total(width), width


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
        return out.stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return list(names)


def parse_ptxas(text):
    kernels, current = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)' for '(sm_\d+)'", line)
        if m:
            current = m.group(1)
            kernels[current] = {"mangled": current, "arch": m.group(2)}
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            kernels[current].update(stack_bytes=int(m.group(1)), spill_store_bytes=int(m.group(2)),
                                    spill_load_bytes=int(m.group(3)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m:
            smem = re.search(r"(\d+) bytes smem", line)
            kernels[current].update(registers=int(m.group(1)), static_shared_bytes=int(smem.group(1)) if smem else 0)
    return list(kernels.values())


def occupancy(registers, threads, shared_bytes):
    warps = -(-threads // 32)
    unit = SM90["register_alloc_unit_per_warp"]
    per_warp = -(-max(registers, 1) * 32 // unit) * unit
    by_regs = (SM90["registers_per_sm"] // per_warp) // warps
    by_warps = SM90["max_warps_per_sm"] // warps
    by_smem = SM90["shared_bytes_per_sm"] // (shared_bytes + SM90["shared_reserved_per_cta"])
    limits = {"registers": by_regs, "warps": by_warps, "shared": by_smem, "ctas": SM90["max_ctas_per_sm"]}
    ctas = min(limits.values())
    return ctas, min(limits, key=limits.get), ctas * warps / SM90["max_warps_per_sm"]


def describe(k, gamma):
    """Threads and dynamic shared memory of one instantiation, from its demangled name."""
    name = k["name"]
    base = re.search(r"kernels::(\w+)<", name)
    base = base.group(1) if base else name
    k["kernel"] = base
    dynamic = 0
    threads = THREADS.get(base)
    m = re.search(r"score_blocked_kernel<([\w:]+), (\d+), (\d+)>", name)
    if m:
        elem, head_dim, tile = ELEMENT_BYTES.get(m.group(1), 4), int(m.group(2)), int(m.group(3))
        threads = head_dim if head_dim > 0 else 128
        d = head_dim if head_dim > 0 else 100  # the generic kernel, shown at head dim 100
        dynamic = blocked_smem(d, elem, tile, lowpass_cutoff(tile, gamma), threads)
        k["dynamic_shared_note"] = "block_size %d, gamma %g, head_dim %d" % (tile, gamma, d)
    if base == "compact_paged_kernel":
        dynamic = 32 * 1024  # kCompactStageBytes
    if base == "query_tails_kernel":  # query_tails_smem_bytes: 32 keys (rows padded by one) and 8 queries
        dynamic = (32 * (128 + 1) + 8 * 128) * 4
        k["dynamic_shared_note"] = "head_dim 128 (launched by query_tails_async, not by compress_async)"
    if base == "score_grid_kernel":
        dynamic, width = grid_smem(8, 8, 128, gamma)
        k["dynamic_shared_note"] = "8 x 8 tiles, triangle zone, gamma %g, head_dim 128 (%d columns a chunk)" % (
            gamma, width)
    k["threads"] = threads
    k["dynamic_shared_bytes"] = dynamic
    k["shared_bytes"] = k.get("static_shared_bytes", 0) + dynamic
    k["spill_bytes"] = k.get("spill_store_bytes", 0) + k.get("spill_load_bytes", 0)
    if threads:
        k["ctas_per_sm"], k["occupancy_limit"], k["warp_occupancy"] = occupancy(k["registers"], threads,
                                                                                k["shared_bytes"])
    else:
        k["ctas_per_sm"] = None


# ---- SASS: the blocked scorer's frequency step -----------------------------------
SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def function_sass(sass, mangled):
    out, inside = [], False
    for line in sass.splitlines():
        if "Function : " in line:
            inside = line.strip().endswith(mangled)
            continue
        if inside:
            m = SASS_LINE.search(line)
            if m:
                out.append((int(m.group(1), 16), m.group(3), m.group(4)))
    return out


def frequency_step(instructions, tile):
    """The smallest loop (a backward branch) holding the step's 2 * tile FFMAs (two frequencies of a full block)."""
    best = None
    for addr, op, args in instructions:
        if not op.startswith("BRA"):
            continue
        target = re.search(r"0x([0-9a-f]+)", args)
        if not target or int(target.group(1), 16) >= addr:
            continue
        lo = int(target.group(1), 16)
        body = [(a, o) for a, o, _ in instructions if lo <= a <= addr]
        ffma = sum(1 for _, o in body if o.startswith("FFMA"))
        if ffma >= 2 * tile and (best is None or len(body) < best["instructions"]):
            best = {"instructions": len(body), "ffma": ffma,
                    "shared_loads": sum(1 for _, o in body if o.startswith("LDS")),
                    "other": len(body) - ffma - sum(1 for _, o in body if o.startswith("LDS")),
                    "start": hex(lo), "end": hex(addr)}
    return best


# ---- the whole-model estimate ------------------------------------------------------
def model(step, gamma):
    c = {
        "layers": 28, "kv_heads": 4, "head_dim": 128, "tokens": 8192, "element_bytes": 2,
        "keep_ratio": 0.2, "block_size": 64, "gamma": gamma,
        "hbm_bytes_per_s": 4.8e12,          # H200 HBM3e, NVIDIA's figure; sustained copies reach ~85-90%
        "fp32_flops_per_s": 67e12,          # H200 SXM FP32 (non-tensor), 2 per FMA
        "sms": 132, "warp_issue_per_sm_per_clock": 4, "clock_hz": 1.98e9,  # H200 SXM boost clock
        "launch_s": 3e-6,                   # per kernel launch in a stream (graph replay is lower)
    }
    L, H, d, N, e = c["layers"], c["kv_heads"], c["head_dim"], c["tokens"], c["element_bytes"]
    elements = 2 * L * H * N * d              # K and V
    kv_bytes = elements * e
    kept_bytes = kv_bytes * c["keep_ratio"]
    scores_bytes = L * H * N * 4
    m = lowpass_cutoff(c["block_size"], gamma)
    # Blocked: read K, V once; scores written, read by select ~6 times (forced count, 4 radix passes, emit);
    # the gather reads and writes the kept rows.
    blocked_bytes = kv_bytes + scores_bytes * 7 + 2 * kept_bytes
    # A full block folds by the DCT's symmetry: per element and frequency half an FMA for y_k and half
    # for x -= y_k C_k (each over the folded half of the rows); its step takes two frequencies at once.
    blocked_flops = elements * m * 2
    threads = elements // c["block_size"]     # one thread per (block, column) of K or of V
    step_instructions = step["instructions"] if step else None
    warp_instructions = threads * (m / 2) * step_instructions / 32 if step else None
    issue_s = (warp_instructions / (c["sms"] * c["warp_issue_per_sm_per_clock"] * c["clock_hz"])
               if step else None)
    blocked = {
        "bytes": blocked_bytes, "memory_s": blocked_bytes / c["hbm_bytes_per_s"],
        "flops": blocked_flops, "fp32_s": blocked_flops / c["fp32_flops_per_s"],
        "step_warp_instructions": warp_instructions, "issue_s": issue_s,
        "launches": 8, "launch_s": 8 * c["launch_s"],
    }
    blocked["estimate_s"] = max(blocked["memory_s"], blocked["fp32_s"], issue_s or 0) + blocked["launch_s"]
    # Global: per layer, finite check reads K, V; pack reads K, V, writes z (complex float, H d N);
    # cuFFT forward and inverse read and write z once each (one pass assumed at N = 8192); the low-pass
    # reads and writes z; the residual reads z and K, V; then select and gather as above.
    z = H * d * N * 8
    layer_kv = kv_bytes / L
    global_bytes = L * (layer_kv + (layer_kv + z) + 2 * z + 2 * z + 2 * z + (z + layer_kv)) \
        + scores_bytes * 7 + 2 * kept_bytes
    global_flops = L * 2 * (H * d) * 5 * N * math.log2(N)  # two complex FFTs per column, 5 N log2 N each
    launches = 2 + L * 5 + 5
    glob = {
        "bytes": global_bytes, "memory_s": global_bytes / c["hbm_bytes_per_s"],
        "flops": global_flops, "fp32_s": global_flops / c["fp32_flops_per_s"],
        "launches": launches, "launch_s": launches * c["launch_s"],
    }
    glob["estimate_s"] = max(glob["memory_s"], glob["fp32_s"]) + glob["launch_s"]
    return {"constants": c, "frequencies_per_block": m, "kv_bytes": kv_bytes, "blocked": blocked, "global": glob,
            "goal_blocked_s": 0.25e-3,
            "note": "per path: the largest of memory, FP32 and instruction-issue time, plus kernel launches"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ptxas", required=True)
    ap.add_argument("--sass")
    ap.add_argument("--out", required=True)
    ap.add_argument("--nvcc-version", default="")
    ap.add_argument("--gamma", type=float, default=0.2)
    args = ap.parse_args()
    with open(args.ptxas) as f:
        kernels = parse_ptxas(f.read())
    if not kernels:
        sys.exit("static report: no 'Compiling entry function' lines in %s" % args.ptxas)
    for k, name in zip(kernels, demangle([k["mangled"] for k in kernels])):
        k["name"] = name.replace("flashcache::gpu::kernels::", "kernels::") if "kernels::" in name else name
        describe(k, args.gamma)
    kernels.sort(key=lambda k: k["name"])
    step = None
    if args.sass:
        with open(args.sass) as f:
            sass = f.read()
        target = next((k["mangled"] for k in kernels
                       if re.search(r"score_blocked_kernel<float, 128, 64>", k["name"])), None)
        if target:
            step = frequency_step(function_sass(sass, target), 64)
    doc = {
        "schema": 1,
        "arch": "sm_90",
        "compiler": args.nvcc_version,
        "source": "bench/gpu/static_kernels.cu (every kernel compress_async launches, float/half/bfloat16)",
        "sm90_limits": SM90,
        "kernels": kernels,
        "blocked_step_kernel": "score_blocked_kernel<float, 128, 64>",
        "blocked_step_instructions": step["instructions"] if step else None,
        "blocked_step": step,
        "model": model(step, args.gamma),
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
        f.write("\n")
    worst = max(kernels, key=lambda k: k.get("spill_bytes", 0))
    print("static report: %d kernels, blocked step %s instructions, most spill %d bytes (%s) -> %s" % (
        len(kernels), step["instructions"] if step else "n/a", worst.get("spill_bytes", 0), worst["name"], args.out))


if __name__ == "__main__":
    main()
