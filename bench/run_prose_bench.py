#!/usr/bin/env python3
"""Runs a decode benchmark on the project's own prose and writes its JSON with
provenance: the machine, its load before and after, the date, the command and
the wall time. Shared by bench/engine/bench.sh and bench/llama_cpp/bench.sh.

  bench/run_prose_bench.py --program BIN --out bench/results/X.json --command "..."
                           [--field KEY=TEXT ...] [-- program options]

The prompt is the project's own prose (English text, code and tables), given
to the program as --prompt-file; the program repeats its tokens to length.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

PROSE = ["README.md", "tools/extract/README.md", "docs/GPU.md"]


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def cpu_model():
    with open("/proc/cpuinfo") as f:
        return next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--command", required=True, help="the command line to record (trailing spaces dropped)")
    ap.add_argument("--field", action="append", default=[], metavar="KEY=TEXT", help="a text field to add")
    ap.add_argument("options", nargs=argparse.REMAINDER, help="options for the program, after --")
    args = ap.parse_args()
    options = args.options[1:] if args.options[:1] == ["--"] else args.options

    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as prompt:
        for path in PROSE:
            with open(path) as f:
                prompt.write(f.read())
    try:
        before, start = loadavg(), time.time()
        run = subprocess.run([args.program, "--prompt-file", prompt.name, *options], stdout=subprocess.PIPE,
                             check=False)
        wall = int(time.time() - start)
    finally:
        os.unlink(prompt.name)
    if run.returncode != 0:
        sys.exit(f"{args.program} failed with status {run.returncode}; {args.out} left as it was")
    doc = json.loads(run.stdout)
    doc["machine"] = {"cpus": os.cpu_count(), "cpu": cpu_model(), "system": platform.platform(),
                      "loadavg_before": before, "loadavg_after": loadavg()}
    doc["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    doc["command"] = args.command.strip()
    doc["wall_s"] = wall
    doc["prompt_source"] = " + ".join(PROSE) + ", tokens repeated to length"
    for field in args.field:
        key, _, text = field.partition("=")
        doc[key] = text
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, args.out)  # never a half-written result
    print("wrote " + args.out)


if __name__ == "__main__":
    main()
