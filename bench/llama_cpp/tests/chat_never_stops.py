#!/usr/bin/env python3
"""A 20-turn chat piped through flashcache_chat in 1,024 cells (a chat that never hits
the wall): it never errors, positions stay below n_ctx, the context fills at least 3 times, and a fact from turn 1 (its system prompt, which the manager protects as n_keep)
is answered in the last turn. Usage: chat_never_stops.py FLASHCACHE_CHAT"""
import json
import subprocess
import sys

TOPICS = ["the weather", "rivers", "mountains", "bread", "trains", "music", "chess", "gardens", "the moon",
          "bicycles", "coffee", "libraries", "rain", "bridges", "owls", "snow", "boats", "tea"]


def main() -> int:
    system = "You are a helpful assistant. The user's cat is called Pickle."
    turns = ["Hello! Tell me about yourself."]
    turns += [f"Write a long story about {t}." for t in TOPICS]
    turns.append("What is the name of my cat?")
    assert len(turns) == 20
    # --no-recall: compaction with renumbering. With recall (the chat's default) positions are kept,
    # and this system-prompt fact, ~3,400 positions before the question, is missed: a measured loss
    # (docs/LLAMA_CPP.md, "Bringing back what a new turn needs").
    run = subprocess.run([sys.argv[1], "-c", "1024", "-n", "160", "-t", "2", "--json", "-s", system, "--no-recall"],
                         input="\n".join(turns) + "\n", capture_output=True, text=True, timeout=1200)
    if run.returncode == 2 and "no model" in run.stderr:
        print("SKIP: " + run.stderr.strip())
        return 0
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["ok"], out
    assert len(out["replies"]) == 20, len(out["replies"])
    assert out["max_position"] < out["n_ctx"], (out["max_position"], out["n_ctx"])
    fills = len(out["events"])
    assert fills >= 3, f"the context filled {fills} times"
    last = out["replies"][-1]
    assert "Pickle" in last, f"turn 20 answered {last!r}"
    print(f"20 turns, {fills} events, highest position {out['max_position']}, answer {last!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
