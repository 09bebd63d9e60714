#!/usr/bin/env python3
"""Counts the hops of a walked call (hop_walk.cpp): its (call site, function) pairs mapped to
source files with addr2line, then the calls from a function of one file into a function of
another file, each distinct (caller, callee) pair once. Prints the count, the files entered,
the entries into each file, and how often the call ran check_options and check_shared_options.

  python3 tools/hops/hops.py BINARY EDGES.txt SOURCE_TREE
"""
import collections
import os
import subprocess
import sys


def locate(binary, addresses):
    """addr2line: each address's function name and file."""
    out = subprocess.run(["addr2line", "-f", "-C", "-e", binary, *addresses], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    return {a: (out[2 * i], out[2 * i + 1].split(":")[0]) for i, a in enumerate(addresses)}


def main():
    binary, edges_path, tree = sys.argv[1], sys.argv[2], os.path.realpath(sys.argv[3])
    pairs = [line.split() for line in open(edges_path) if line.strip()]
    where = locate(binary, sorted({a for p in pairs for a in p[:2]}))
    project = lambda path: os.path.realpath(path).startswith(os.path.join(tree, "include"))
    edges, runs = set(), collections.Counter()
    for site, fn, count in pairs:
        caller, caller_file = where[site]
        callee, callee_file = where[fn]
        if project(caller_file) and project(callee_file):
            edges.add((caller, os.path.relpath(caller_file, tree), callee, os.path.relpath(callee_file, tree)))
            runs[callee.split("(")[0].split("::")[-1]] += int(count)
    hops = [e for e in edges if e[1] != e[3]]
    entries = collections.Counter(e[3] for e in hops)
    print(f"{len(hops)} hops (distinct calls from one file's function into another file's) over "
          f"{len(entries)} files; {len(edges) - len(hops)} calls stay in their file")
    plumbing = entries.get("include/flashcache/error.hpp", 0)
    print(f"{len(hops) - plumbing} of them outside error.hpp (Status made, tested and destroyed)")
    for f, c in entries.most_common():
        print(f"  {c:3d} into {f}")
    for name in ("check_options", "check_shared_options"):
        print(f"{name} ran {runs[name]} times")


if __name__ == "__main__":
    main()
