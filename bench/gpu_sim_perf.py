"""GPGPU-Sim performance-mode logs of bench/gpu/sim_perf.cu -> JSON, per kernel launch.

    python3 bench/gpu_sim_perf.py LOG... --config gpgpusim.config [--out FILE]

Each LOG is one run of flashcache_sim_perf (bench/gpu_sim_perf.sh keeps them as
sim_perf_N.log, with a sim_perf_N.log.exit beside it: exit code, wall seconds,
date, command). The simulator prints a block of statistics when each kernel
finishes; the program prints "@@sim_perf stage=NAME" before each stage, so every
block after such a line belongs to that stage.

What GPGPU-Sim prints, and where (gpgpu-sim/src/gpgpu-sim):
  gpu_sim_cycle, gpu_sim_insn, gpu_ipc   this kernel's (gpu-sim.cc gpu_print_stat; reset per kernel)
  gpu_occupancy                           only updated with the power model on (gpu-sim.cc cycle()),
                                          which this run leaves off: then it prints nan and we keep null
  everything else                         cumulative since the process started, so a kernel's share is
                                          the difference from the previous block:
    DRAM[i] "n_rd= n_rd_L2_A= n_write= n_wr_bk="  per channel, one count per dram_atom_size
                                          (= BL x busW x n_mem_per_ctrlr) bytes moved (dram.cc)
    total dram reads / writes             the same in atoms, counted at issue (mem_latency_stat.cc), a cross-check
    L1D_total_cache_accesses / misses, L2_total_cache_accesses / misses
    gpgpu_n_shmem_bkconflict, gpgpu_n_stall_shd_mem, gpgpu_stall_shd_mem[...], gpu_stall_dramfull,
    gpu_stall_icnt2sh, gpu_reg_bank_conflict_stalls, the scheduler cycle distribution
    ("Stall:  W0_Idle:  W0_Scoreboard:  W1..W32:" per scheduler cycle, shader.cc)
  "GPGPU-Sim uArch: CTA/core = X, limited by: ..."  the simulator's resource limit, printed at a
                                          kernel's first launch only (shader.cc max_cta)
"""
import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))
from static_report import demangle  # noqa: E402  (the static report's c++filt call)

# Counters that GPGPU-Sim accumulates over the whole process (see above).
CUMULATIVE = [
    "dram_rd", "dram_rd_l2_alloc", "dram_wr", "dram_wr_back", "dram_reads_atoms", "dram_writes_atoms",
    "l1d_accesses", "l1d_misses", "l2_accesses", "l2_misses", "thread_insn", "warp_insn",
    "shmem_bank_conflicts", "l1d_bank_conflicts", "stall_shd_mem", "stall_dramfull", "stall_icnt2sh",
    "reg_bank_conflict_stalls", "shmem_insn", "load_insn", "store_insn",
]
STALL_KEYS = ["stall_shd_mem", "stall_dramfull", "stall_icnt2sh", "reg_bank_conflict_stalls"]

SCALARS = [
    (re.compile(r"^gpu_sim_cycle = (\d+)"), "cycles", int),
    (re.compile(r"^gpu_sim_insn = (\d+)"), "instructions", int),
    (re.compile(r"^gpu_ipc =\s*([-\w.]+)"), "ipc", float),
    (re.compile(r"^gpu_occupancy = ([-\w.]+)%"), "occupancy", float),
    (re.compile(r"^gpu_tot_sim_cycle = (\d+)"), "total_cycles", int),
    (re.compile(r"^kernel_launch_uid = (\d+)"), "uid", int),
    (re.compile(r"^gpu_stall_dramfull = (\d+)"), "stall_dramfull", int),
    (re.compile(r"^gpu_stall_icnt2sh\s*= (\d+)"), "stall_icnt2sh", int),
    (re.compile(r"^\s*L1D_total_cache_accesses = (\d+)"), "l1d_accesses", int),
    (re.compile(r"^\s*L1D_total_cache_misses = (\d+)"), "l1d_misses", int),
    (re.compile(r"^L2_total_cache_accesses = (\d+)"), "l2_accesses", int),
    (re.compile(r"^L2_total_cache_misses = (\d+)"), "l2_misses", int),
    (re.compile(r"^gpgpu_n_tot_thrd_icount = (\d+)"), "thread_insn", int),
    (re.compile(r"^gpgpu_n_tot_w_icount = (\d+)"), "warp_insn", int),
    (re.compile(r"^gpgpu_n_stall_shd_mem = (\d+)"), "stall_shd_mem", int),
    (re.compile(r"^gpgpu_n_shmem_insn = (\d+)"), "shmem_insn", int),
    (re.compile(r"^gpgpu_n_load_insn\s*= (\d+)"), "load_insn", int),
    (re.compile(r"^gpgpu_n_store_insn = (\d+)"), "store_insn", int),
    (re.compile(r"^gpgpu_n_shmem_bkconflict = (\d+)"), "shmem_bank_conflicts", int),
    (re.compile(r"^gpgpu_n_l1cache_bkconflict = (\d+)"), "l1d_bank_conflicts", int),
    (re.compile(r"^gpu_reg_bank_conflict_stalls = (\d+)"), "reg_bank_conflict_stalls", int),
    (re.compile(r"^total dram reads = (\d+)"), "dram_reads_atoms", int),
    (re.compile(r"^total dram writes = (\d+)"), "dram_writes_atoms", int),
]
SHD_MEM = re.compile(r"^gpgpu_stall_shd_mem\[(\w+)\]\[(\w+)\] = (\d+)")
DRAM = re.compile(r"n_rd=(\d+) n_rd_L2_A=(\d+) n_write=(\d+) n_wr_bk=(\d+)")
DISTRO = re.compile(r"^Stall:(\d+)\s+W0_Idle:(\d+)\s+W0_Scoreboard:(\d+)((?:\s+W\d+:\d+)*)")
CTA_LIMIT = re.compile(r"GPGPU-Sim uArch: CTA/core = (\d+), limited by:(.*)")
MARKER = re.compile(r"^@@sim_perf stage=(\w+) tokens=(\d+)")
PTXINFO = re.compile(r"GPGPU-Sim PTX: Kernel '(\S+)' : regs=(\d+), lmem=(\d+), smem=(\d+)")
PUSH = re.compile(r"GPGPU-Sim PTX: pushing kernel '(\S+)' to stream \d+, gridDim= \((\d+),(\d+),(\d+)\) "
                  r"blockDim = \((\d+),(\d+),(\d+)\)")

# Pipeline stage of each kernel (include/flashcache/cuda/run.cuh's order).
PIPELINE = {
    "sequence_table_kernel": "0 sequence table",
    "check_lengths_kernel": "1 score: checks", "finite_kernel": "1 score: substitutes",
    "substitute_kernel": "1 score: substitutes", "pack_kernel": "1 score: pack",
    "lowpass_kernel": "1 score: base", "base_energy_kernel": "1 score: base", "base_choose_kernel": "1 score: base",
    "chosen_base_kernel": "1 score: base", "residual_kernel": "1 score: residual",
    "score_blocked_kernel": "1 score: blocked", "blocked_edges_kernel": "1 score: blocked",
    "score_grid_kernel": "1 score: image spans",
    "energy_kernel": "1b energy", "mix_tails_kernel": "1c tails", "allocate_kernel": "2 allocate",
    "base_sample_kernel": "3 select", "select_kernel": "3 select",
    "gather_kernel": "4 gather", "compact_paged_kernel": "4 compact", "page_owner_kernel": "4 compact",
    "copy_kernel": "copy", "decode_split_kernel": "decode", "decode_merge_kernel": "decode",
    "scrub_kernel": "scrub",
}


def parse_config(path):
    """The options of a gpgpusim.config, the last occurrence winning (as the simulator's parser does)."""
    opts, text = {}, open(path).read()
    text = re.sub(r"\\\n", " ", text)
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^(-\S+)\s+(.*)$", line)
        if m:
            opts[m.group(1)] = m.group(2).strip().strip('"')
    return opts


def machine_model(opts):
    """Peak DRAM bandwidth and clocks of the simulated GPU, from its config.

    A DRAM read or write command moves one atom, BL x busW x n_mem_per_ctrlr bytes
    (gpu-sim.h dram_atom_size), and holds the data bus BL / data_command_freq_ratio
    DRAM cycles (dram.cc: bwutil += BL / ratio). So one channel moves at most
        busW x n_mem_per_ctrlr x data_command_freq_ratio bytes per DRAM clock,
    and the GPU
        peak = n_mem x busW x n_mem_per_ctrlr x data_command_freq_ratio x f_dram.
    SM7_QV100: 32 x 16 B x 1 x 2 x 850 MHz = 870.4 GB/s (a V100's HBM2: 900 GB/s).
    gpu_sim_cycle counts core clocks, so the peak per cycle is peak / f_core.
    """
    core, icnt, l2, dram = (float(x) for x in opts["-gpgpu_clock_domains"].split(":"))
    n_mem = int(opts["-gpgpu_n_mem"])
    bus = int(opts["-gpgpu_dram_buswidth"])
    burst = int(opts["-gpgpu_dram_burst_length"])
    ratio = int(opts.get("-dram_data_command_freq_ratio", "1"))
    chips = int(opts.get("-gpgpu_n_mem_per_ctrlr", "1"))
    peak = n_mem * bus * chips * ratio * dram * 1e6
    # L2: sets x line x ways per sub-partition ("S:32:128:24,..."), times the sub-partitions.
    l2_geometry = opts.get("-gpgpu_cache:dl2", "").split(",")[0].split(":")
    subs = int(opts.get("-gpgpu_n_sub_partition_per_mchannel", "1"))
    l2_bytes = None
    if len(l2_geometry) >= 4:
        l2_bytes = int(l2_geometry[1]) * int(l2_geometry[2]) * int(l2_geometry[3]) * n_mem * subs
    return {
        "core_clock_mhz": core, "interconnect_clock_mhz": icnt, "l2_clock_mhz": l2, "dram_clock_mhz": dram,
        "sms": int(opts["-gpgpu_n_clusters"]) * int(opts.get("-gpgpu_n_cores_per_cluster", "1")),
        "max_warps_per_sm": int(opts.get("-gpgpu_shader_core_pipeline", "2048:32").split(":")[0]) // 32,
        "max_ctas_per_sm": int(opts.get("-gpgpu_shader_cta", "32")),
        "n_mem": n_mem, "dram_bus_width_bytes": bus, "dram_burst_length": burst,
        "dram_data_command_freq_ratio": ratio, "n_mem_per_ctrlr": chips,
        "dram_atom_bytes": burst * bus * chips,
        "peak_dram_bytes_per_s": peak,
        "peak_dram_bytes_per_core_cycle": peak / (core * 1e6),
        "l2_bytes": l2_bytes,
        "kernel_launch_latency_cycles": int(opts.get("-gpgpu_kernel_launch_latency", "0")),
        "peak_formula": "n_mem x dram_buswidth x n_mem_per_ctrlr x dram_data_command_freq_ratio x dram clock "
                        "(one burst of BL x buswidth bytes per BL / ratio DRAM cycles)",
    }


def short_name(demangled):
    """'void flashcache::gpu::kernels::select_kernel<0>(...)' -> 'select_kernel'; template arguments kept
    where they say something (element type, head dim, tile)."""
    name = demangled.replace("(anonymous namespace)::", "").split("(")[0].replace("void ", "")
    name = re.sub(r"^.*::(?=\w+(<|$))", "", name)
    name = name.replace("flashcache::", "").replace("gpu::kernels::", "").replace("bench::gpu::", "")
    return name.replace("<0>", "")


def base_name(short):
    return short.split("<")[0]


def parse_log(path):
    """Kernel records (cumulative counters still cumulative), the program's own lines, the markers seen."""
    records, notes, cur, stage, limit = [], [], None, "setup", None
    cta_by_name, pushed, ptxinfo = {}, [], {}
    for raw in open(path, errors="replace"):
        line = raw.rstrip("\n")
        m = MARKER.match(line)
        if m:
            stage = m.group(1)
            continue
        if line.startswith("sim_perf:"):
            notes.append(line)
            continue
        m = CTA_LIMIT.search(line)
        if m:
            if stage != "setup":  # in setup it answers sim_perf's occupancy query (decode_splits)
                limit = (int(m.group(1)), m.group(2).strip())
            continue
        m = PTXINFO.search(line)
        if m:  # what the simulator's own ptxas run found: its occupancy uses these (static smem only)
            ptxinfo[m.group(1)] = {"registers": int(m.group(2)), "local_bytes": int(m.group(3)),
                                   "static_shared_bytes": int(m.group(4))}
            continue
        m = PUSH.search(line)
        if m:  # launches in stream order; each statistics block takes the first of its name
            g = [int(x) for x in m.groups()[1:]]
            pushed.append((m.group(1), g[0] * g[1] * g[2], g[3] * g[4] * g[5]))
            continue
        if line.startswith("kernel_name = "):
            cur = {"mangled": line.split("=", 1)[1].split()[0] if line.split("=", 1)[1].split() else "?",
                   "stage": stage, "dram": [0, 0, 0, 0], "shd_mem": {}}
            if limit is not None:
                cta_by_name[cur["mangled"]] = limit
                limit = None
            cur["cta_limit"] = cta_by_name.get(cur["mangled"])
            launch = next((p for p in pushed if p[0] == cur["mangled"]), None)
            if launch is not None:
                pushed.remove(launch)
                cur["ctas"], cur["threads_per_cta"] = launch[1], launch[2]
            cur["ptxinfo"] = ptxinfo.get(cur["mangled"])
            records.append(cur)
            continue
        if cur is None:
            continue
        for pattern, key, kind in SCALARS:
            m = pattern.match(line)
            if m:
                try:
                    value = kind(m.group(1))
                except ValueError:
                    value = None
                cur[key] = value if value is None or value == value else None  # nan (no power model): null
                break
        else:
            m = DRAM.search(line)
            if m:
                for i in range(4):
                    cur["dram"][i] += int(m.group(i + 1))
                continue
            m = SHD_MEM.match(line)
            if m:
                cur["shd_mem"]["%s/%s" % (m.group(1), m.group(2))] = int(m.group(3))
                continue
            m = DISTRO.match(line)
            if m:
                cur["distro"] = {"Stall": int(m.group(1)), "W0_Idle": int(m.group(2)),
                                 "W0_Scoreboard": int(m.group(3))}
                cur["distro"]["issued"] = sum(int(x) for x in re.findall(r"W\d+:(\d+)", m.group(4)))
    for r in records:
        r["dram_rd"], r["dram_rd_l2_alloc"], r["dram_wr"], r["dram_wr_back"] = r.pop("dram")
    return records, notes


def diff(cur, prev):
    return {k: cur.get(k, 0) - prev.get(k, 0) for k in set(cur) | set(prev)}


def kernel_records(raw, model):
    """Per-launch values from the cumulative ones; a record missing its statistics block is dropped."""
    atom = model["dram_atom_bytes"]
    peak = model["peak_dram_bytes_per_core_cycle"]
    prev = {k: 0 for k in CUMULATIVE}
    prev_shd, prev_distro = {}, {}
    out = []
    names = demangle([r["mangled"] for r in raw])
    for r, dem in zip(raw, names):
        if "cycles" not in r:
            continue
        d = {k: r.get(k, prev[k]) - prev[k] for k in CUMULATIVE}
        prev = {k: r.get(k, prev[k]) for k in CUMULATIVE}
        shd = diff(r["shd_mem"], prev_shd)
        prev_shd = dict(r["shd_mem"])
        distro = diff(r.get("distro", {}), prev_distro)
        prev_distro = dict(r.get("distro", {}))
        short = short_name(dem)
        cycles = r["cycles"]
        read_bytes = (d["dram_rd"] + d["dram_rd_l2_alloc"]) * atom
        write_bytes = (d["dram_wr"] + d["dram_wr_back"]) * atom
        stalls = {k: d[k] for k in STALL_KEYS}
        stalls.update({"shd_mem[%s]" % k: v for k, v in shd.items() if v})
        stalls.update({"scheduler_%s" % k: v for k, v in distro.items() if k != "issued"})
        top = sorted(((k, v) for k, v in stalls.items() if v > 0), key=lambda kv: -kv[1])[:4]
        rec = {
            "kernel": short, "name": dem, "stage": r["stage"], "pipeline": PIPELINE.get(base_name(short), "other"),
            "uid": r.get("uid"), "cycles": cycles, "instructions": r.get("instructions"), "ipc": r.get("ipc"),
            "occupancy": r.get("occupancy"),
            "dram_read_bytes": read_bytes, "dram_write_bytes": write_bytes,
            "dram_bytes": read_bytes + write_bytes,
            "dram_atoms_issued": {"reads": d["dram_reads_atoms"], "writes": d["dram_writes_atoms"]},
            "dram_bandwidth_share": (read_bytes + write_bytes) / cycles / peak if cycles else None,
            "l1d_hit_rate": 1 - d["l1d_misses"] / d["l1d_accesses"] if d["l1d_accesses"] else None,
            "l2_hit_rate": 1 - d["l2_misses"] / d["l2_accesses"] if d["l2_accesses"] else None,
            "l1d_accesses": d["l1d_accesses"], "l2_accesses": d["l2_accesses"],
            "shmem_bank_conflicts": d["shmem_bank_conflicts"], "shmem_insn": d["shmem_insn"],
            "scheduler_cycles": distro,
            "stalls": stalls, "top_stalls": [k for k, _ in top],
        }
        rec["ctas"], rec["threads_per_cta"] = r.get("ctas"), r.get("threads_per_cta")
        if r.get("ptxinfo"):
            rec["simulator_ptxinfo"] = r["ptxinfo"]
        if r.get("cta_limit"):
            rec["ctas_per_sm_limit"], rec["ctas_per_sm_limited_by"] = r["cta_limit"]
        if r.get("cta_limit") and r.get("ctas"):
            # Warp slots the kernel can fill: by its resources (the simulator's CTA/core), and by its grid
            # as well (max_cta lowers the limit to ceil(CTAs / SMs) for a small grid).
            warps = -(-r["threads_per_cta"] // 32)
            limit = r["cta_limit"][0]
            grid = min(limit, -(-r["ctas"] // model["sms"]))
            rec["occupancy_resource_limit"] = limit * warps / model["max_warps_per_sm"]
            rec["occupancy_grid_limit"] = grid * warps / model["max_warps_per_sm"]
        out.append(rec)
    return out


def sums(records):
    keys = ["cycles", "instructions", "dram_read_bytes", "dram_write_bytes", "dram_bytes"]
    s = {k: sum(r[k] or 0 for r in records) for k in keys}
    s["launches"] = len(records)
    s["shmem_bank_conflicts"] = sum(r["shmem_bank_conflicts"] for r in records)
    return s


def summarize(kernels, model, tokens, exit_info, notes):
    """Per-stage sums; a scrub's DRAM writes are the previous stage's lines written back late."""
    stages, order = {}, []
    last = None
    for r in kernels:
        if r["stage"] == "scrub":
            if last is not None:
                stages[last]["deferred_write_bytes"] += r["dram_write_bytes"]
            continue
        if r["stage"] not in stages:
            stages[r["stage"]] = {"kernels": [], "deferred_write_bytes": 0}
            order.append(r["stage"])
        stages[r["stage"]]["kernels"].append(r)
        last = r["stage"]
    peak = model["peak_dram_bytes_per_core_cycle"]
    latency = model["kernel_launch_latency_cycles"]
    out = {}
    for name in order:
        st = stages[name]
        s = sums(st["kernels"])
        s["deferred_write_bytes"] = st["deferred_write_bytes"]
        s["dram_bytes_with_deferred"] = s["dram_bytes"] + s["deferred_write_bytes"]
        s["dram_bandwidth_share"] = s["dram_bytes_with_deferred"] / s["cycles"] / peak if s["cycles"] else None
        s["launch_latency_cycles"] = latency * s["launches"]
        groups = {}
        for r in st["kernels"]:
            g = groups.setdefault(r["pipeline"], {"kernels": []})
            g["kernels"].append(r["kernel"])
            for k in ["cycles", "dram_bytes", "instructions"]:
                g[k] = g.get(k, 0) + (r[k] or 0)
        s["pipeline"] = groups
        out[name] = s
    kv_bytes = 2 * 8 * tokens * 128 * 2
    size = {"tokens": tokens, "kv_bytes": kv_bytes, "notes": notes, "stages": out, "kernels": kernels}
    size["kept_rows_per_head"] = {m.group(1): int(m.group(2)) for m in (
        re.search(r"^sim_perf: check (\w+):.* kept/head (\d+)", n) for n in notes) if m}
    # What a gather must move at least: the kept rows of K and V, read once and written once.
    for name, rows in size["kept_rows_per_head"].items():
        if name in out and "4 gather" in out[name]["pipeline"]:
            out[name]["pipeline"]["4 gather"]["useful_bytes"] = 2 * 2 * 8 * rows * 128 * 2
    size.update(exit_info)
    copy = out.get("copy")
    if copy and copy["cycles"]:
        rate = copy["dram_bytes_with_deferred"] / copy["cycles"]
        size["copy_bytes_per_cycle"] = rate
        for s in out.values():
            b = s["dram_bytes_with_deferred"]
            s["copy_cycles_same_bytes"] = b / rate
            s["share_of_copy_speed"] = b / rate / s["cycles"] if s["cycles"] else None
            for g in s["pipeline"].values():
                g["share_of_copy_speed"] = g["dram_bytes"] / rate / g["cycles"] if g["cycles"] else None
                if "useful_bytes" in g:
                    g["useful_share_of_copy_speed"] = g["useful_bytes"] / rate / g["cycles"] if g["cycles"] else None
        for r in kernels:
            r["share_of_copy_speed"] = r["dram_bytes"] / rate / r["cycles"] if r["cycles"] else None
        # The global path's two FFTs (1024 columns of N complex floats) ran on the host: a lower bound
        # for cuFFT on the device is one read and one write of z per FFT, at the copy's rate.
        z = 8 * 128 * tokens * 8
        size["fft_estimate"] = {"bytes": 4 * z, "cycles": 4 * z / rate,
                                "note": "2 cuFFT C2C of z (8 heads x 128 columns x N complex floats), each "
                                        "reading and writing z once at the simulated copy's rate: a lower bound, "
                                        "not simulated"}
    return size


def read_exit(log):
    info = {"exit_code": None, "wall_s": None, "run_date": None, "functional_check": None, "tree": None,
            "command": None}
    try:
        text = open(log + ".exit").read().strip()
    except OSError:
        return info
    m = re.match(r"rc=(\d+) seconds=(\d+) date=(\S+) check=(\S+)(?: tree=(\S+))? command=(.*)", text)
    if m:  # check: the "sim_perf: check" lines against a functional-mode run (same, DIFFERENT, skipped)
        info.update(exit_code=int(m.group(1)), wall_s=int(m.group(2)), run_date=m.group(3),
                    functional_check=m.group(4), tree=m.group(5), command=m.group(6))
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--config", required=True, help="the gpgpusim.config the runs used")
    ap.add_argument("--simulator", default="/tmp/gpusim")
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "results", "gpu_sim_perf.json"))
    args = ap.parse_args()
    opts = parse_config(args.config)
    model = machine_model(opts)
    sizes = []
    for log in args.logs:
        raw, notes = parse_log(log)
        tokens = next((int(m.group(1)) for m in (re.search(r"f16, (\d+) tokens", n) for n in notes) if m), None)
        if tokens is None:
            print("gpu_sim_perf: %s has no sim_perf header line, skipped" % log, file=sys.stderr)
            continue
        kernels = kernel_records(raw, model)
        size = summarize(kernels, model, tokens, read_exit(log), notes)
        size["log"] = os.path.basename(log)
        sizes.append(size)
    sizes.sort(key=lambda s: s["tokens"])
    appended = open(args.config).read().split("# bench/gpu_sim_perf.sh", 1)
    extra = " ".join(line.strip() for line in appended[1].splitlines() if line.strip()) if len(appended) > 1 else ""
    snapshot = ""
    try:
        snapshot = subprocess.run(["git", "-C", os.path.join(args.simulator, "gpgpu-sim"), "log", "-1", "--format=%s"],
                                  capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    doc = {
        "schema": 1,
        "about": "One layer (8 KV heads, head dim 128, f16, keep 0.2) under GPGPU-Sim's performance model of a "
                 "V100-class GPU (bench/gpu_sim_perf.sh): simulated core cycles per kernel, not a GPU time. The "
                 "global transform's FFTs ran on the host (FLASHCACHE_GPU_SIM) and are in no simulated cycle.",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.platform(),
        "commit": args.commit,
        "command": "; ".join(dict.fromkeys(s["command"] for s in sizes if s.get("command"))) or "bench/gpu_sim_perf.sh",
        "simulator": {"snapshot": snapshot, "config": "SM7_QV100 (tested-cfgs) with: " + extra,
                      "gpu": "SM7_QV100" if model["sms"] == 80 else "SM7_QV100 scaled to %d SMs" % model["sms"]},
        "model": model,
        "gpu_note": None if model["sms"] == 80 else (
            "SM7_QV100 scaled to %d SMs of at most %d CTAs: GPGPU-Sim's timing model indexes its per-SM bar.red "
            "(__syncthreads_or) store of 32 CTA slots with hw_cta_id x SMs + SM id (cuda-sim.cc:2105, "
            "abstract_hardware_model.h:1384) and never clears it, so with 80 SMs the library's stop_requested() "
            "reads past it and CTAs skip their work; SMs x CTAs per SM <= 32 keeps it in range (bench/gpu_sim_perf.sh)"
            % (model["sms"], model["max_ctas_per_sm"])),
        "shape": {"layers": 1, "kv_heads": 8, "head_dim": 128, "dtype": "f16", "layout": "HND", "keep_ratio": 0.2,
                  "decode": "batch 1, 32 query heads over the full cache (read as bf16: same bytes)"},
        "sizes": sizes,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("gpu_sim_perf: %d sizes, %d kernel launches -> %s" % (
        len(sizes), sum(len(s["kernels"]) for s in sizes), args.out))


if __name__ == "__main__":
    main()
