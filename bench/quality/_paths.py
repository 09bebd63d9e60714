"""Puts tools/ on sys.path, so that long_eval.py and its test can ``import smollm2``
(tools/smollm2, the numpy reference model). The one sys.path edit of bench/quality:
the scripts here start with ``import _paths`` (their own folder is already on the path,
as sys.path[0] for a script and through pytest's rootdir insertion for the tests)."""
import os
import sys

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools")
if TOOLS not in sys.path:
    sys.path.insert(0, TOOLS)
