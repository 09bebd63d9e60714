"""Puts tools/ on sys.path, so that the scripts of this folder can ``import smollm2``
(tools/smollm2, the numpy reference model). The one sys.path edit of tools/extract:
scripts here start with ``import _paths`` (their own folder is already on the path, as
sys.path[0] for a script and through pytest's rootdir insertion for the tests)."""
import os
import sys

TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TOOLS not in sys.path:
    sys.path.insert(0, TOOLS)
