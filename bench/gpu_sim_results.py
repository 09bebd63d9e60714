#!/usr/bin/env python3
"""Collects bench/gpu_sim_check.sh's logs into one JSON (bench/results/gpu_sim.json), which
tools/report/gpu_sim.py renders into bench/RESULTS.md.

  gpu_sim_results.py LOG_DIR OUT.json --simulator DIR --config FILE [--exit BINARY=RC ...]

Per binary: every test that passed, failed or skipped, with the skip's own message (the
reason the test gives), and how the binary ended. The simulation's wall time is kept as
sim_wall_s, a cost of the check on this CPU: it is no GPU time and is never reported as one.
"""
import argparse
import datetime
import glob
import hashlib
import json
import os
import platform
import re
import subprocess

RESULT = re.compile(r"^\[ +(OK|FAILED|SKIPPED) +\] (\S+) \((\d+) ms\)$")
RUN = re.compile(r"^\[ RUN +\] (\S+)$")


# The simulator's own lines, interleaved with gtest's.
SIM_LINE = re.compile(r"^(GPGPU-Sim|gpgpu|kernel|launching|Destroy|event|Processing|Finished|Running|CTA|"
                      r"cudaLaunch|PTX|self exe|Extracting|Detected|Parsing|Loading|Adding|[-*=]|\s*$)")
MARKER = re.compile(r"^\S+:\d+: (Skipped|Failure)$")


def parse_log(path):
    """The tests of one gtest log, in order: name, outcome, and a skip's or failure's message
    (the lines after gtest's "file:line: Skipped" or "Failure", the simulator's own left out)."""
    tests, message, collecting = [], [], False
    with open(path, "rb") as f:
        for raw in f:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if RUN.match(line):
                message, collecting = [], False
                continue
            if m := RESULT.match(line):
                outcome = {"OK": "passed", "FAILED": "failed", "SKIPPED": "skipped"}[m.group(1)]
                test = {"name": m.group(2), "outcome": outcome}
                if outcome != "passed":
                    test["message"] = "\n".join(message[:12]).strip()
                tests.append(test)
                message, collecting = [], False
                continue
            if MARKER.match(line):
                collecting = True
                continue
            if collecting and not SIM_LINE.match(line):
                message.append(line)
    return tests


def simulator(sim_dir):
    """The simulator's snapshot and its patches, identified by a hash of their diff."""
    repo = os.path.join(sim_dir, "gpgpu-sim")
    git = ["git", "-C", repo]
    snapshot = subprocess.run(git + ["log", "-1", "--format=%s"], capture_output=True, text=True).stdout.strip()
    diff = subprocess.run(git + ["diff"], capture_output=True).stdout
    files = subprocess.run(git + ["diff", "--name-only"], capture_output=True, text=True).stdout.split()
    return {"snapshot": snapshot, "patch_sha256_12": hashlib.sha256(diff).hexdigest()[:12], "patched_files": files}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log_dir")
    ap.add_argument("out")
    ap.add_argument("--simulator", required=True)
    ap.add_argument("--config", required=True, help="the gpgpusim.config the tests ran under")
    ap.add_argument("--exit", action="append", default=[], help="BINARY=RC=SECONDS, as the check script saw it")
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    ends = {}
    for e in args.exit:
        name, rc, seconds = e.split("=")
        ends[name] = (int(rc), int(seconds))
    binaries = []
    for path in sorted(glob.glob(os.path.join(args.log_dir, "test_gpu_*.log"))):
        name = os.path.basename(path)[:-4]
        if name not in ends:
            continue  # a log of an earlier run
        rc, seconds = ends[name]
        tests = parse_log(path)
        binaries.append({"binary": name, "exit_code": rc, "sim_wall_s": seconds, "tests": tests,
                         "passed": sum(t["outcome"] == "passed" for t in tests),
                         "failed": sum(t["outcome"] == "failed" for t in tests),
                         "skipped": sum(t["outcome"] == "skipped" for t in tests)})
    with open(args.config) as f:
        ours = f.read().split("# bench/gpu_sim_check.sh", 1)
    doc = {"about": "The GPU tests under GPGPU-Sim in functional mode (bench/gpu_sim_check.sh): results only. "
                    "sim_wall_s is the simulation's wall time on this CPU, not a GPU time.",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": args.commit, "machine": platform.platform(),
           "simulator": simulator(args.simulator),
           "config": "SM7_QV100 (tested-cfgs) with: " + " ".join(
               l.strip() for l in (ours[1] if len(ours) > 1 else "").splitlines() if l.strip().startswith("-")),
           "binaries": binaries}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
