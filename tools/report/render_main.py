"""The command line of a report module: ``python3 tools/report/NAME.py [results.json]``
prints the module's Markdown section for that JSON (bench/results/<default> without one)."""
import json
import os
import sys


def run(render, default_json):
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "results", default_json)
    with open(path) as f:
        print(render(json.load(f)))
