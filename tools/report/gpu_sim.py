"""Markdown section for the GPU tests under GPGPU-Sim (bench/results/gpu_sim.json, collected by
bench/gpu_sim_results.py from bench/gpu_sim_check.sh's run): which tests pass under functional
simulation, which skip and why. Results only: the simulation's wall time is no GPU time and is
not shown."""

ENDS = {0: "ran to the end", 1: "ran to the end, tests failed", 124: "stopped at the time limit",
        143: "stopped before its end (the run's time ran out); the counts are the tests it finished"}


def render(doc):
    sim = doc["simulator"]
    rows = doc["binaries"]
    total = {k: sum(b[k] for b in rows) for k in ("passed", "failed", "skipped")}
    lines = [
        "## GPU tests under a simulator (GPGPU-Sim, functional mode; no GPU)",
        "",
        "From `bench/gpu_sim_check.sh` (how to run it: `tests/gpu/README.md`), commit %s, %s. "
        "GPGPU-Sim %s with the simulator tool's patches (diff sha256 %s..., files: %s), configuration %s. "
        "The kernels run instruction by instruction on the CPU and their outputs are checked against the "
        "CPU reference as on a GPU; nothing here is a speed, and no time of the simulation is a GPU time." % (
            doc.get("commit") or "?", doc["date"], sim["snapshot"], sim["patch_sha256_12"],
            ", ".join("`%s`" % f for f in sim["patched_files"]), doc["config"]),
        "",
        "| binary | passed | failed | skipped | end |",
        "|---|---:|---:|---:|---|",
    ]
    for b in rows:
        lines.append("| `%s` | %d | %d | %d | %s |" % (b["binary"], b["passed"], b["failed"], b["skipped"],
                                                    ENDS.get(b["exit_code"], "exit %d" % b["exit_code"])))
    lines.append("| all | %d | %d | %d | |" % (total["passed"], total["failed"], total["skipped"]))
    lines.append("")
    for note in doc.get("notes", []):
        lines += [note, ""]
    skipped = [(b["binary"], t) for b in rows for t in b["tests"] if t["outcome"] == "skipped"]
    if skipped:
        lines += ["Skipped, each with the reason it gives:", ""]
        for binary, t in skipped:
            lines.append("- `%s` %s: %s" % (binary, t["name"], " ".join(t.get("message", "").split()) or "(no reason)"))
        lines.append("")
    failed = [(b["binary"], t) for b in rows for t in b["tests"] if t["outcome"] == "failed"]
    if failed:
        lines += ["Failed:", ""]
        for binary, t in failed:
            lines.append("- `%s` %s: %s" % (binary, t["name"], " ".join(t.get("message", "").split())[:300]))
        lines.append("")
    return "\n".join(lines)
