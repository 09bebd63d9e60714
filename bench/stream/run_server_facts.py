#!/usr/bin/env python3
"""The 20-turn facts chat (run_chat_facts.py, chat_split.json) through flashcache.server with the
openai client, beside the C++ chat program on the same turns in the same run: facts found, wall
time per turn (the Python layer's overhead as a ratio) and time to first token per turn with the
full cache and with compression, and how many of the 20 replies are the C++ program's word for
word. Nothing is chosen here: the server's defaults are the chat's. Two streams: each reply's
end-of-turn tokens decoded (/v1/chat/completions; the C++ program's --turn-end close), and never
decoded (the chat studies' stream, where SmolLM2 answers: the chat so far as one raw prompt through
/v1/completions; --turn-end open). The server formats the chat as the C++
program does (`--chat-format llama.cpp`: llama.cpp's own
formatting of the model's template); llama-cpp-python's Jinja rendering of SmolLM2's template adds a
default system prompt, and the same turns then differ.

  PYTHONPATH=build/python python3 bench/stream/run_server_facts.py --chat build/bench/llama_cpp/flashcache_chat --threads 1 \
      --out bench/results/server_facts.json
"""

import datetime
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import run_chat_facts as chat  # this folder: sys.path[0] for a script
import run_stream as rs

SERVER_ROWS = {
    # name: (cells, the server's options)
    "server: full cache": (8192, ["--when-full", "none"]),
    "server: flashcache + archive and recall (defaults)": (1024, []),
    "server: flashcache, no recall": (1024, ["--recall", "0"]),
}
# The C++ chat's row of the same policy: its defaults (archive in position order, recall 64; the
# stage-5 choice of run_order.py, not run_chat_facts.py's stage-4 eviction order).
CHAT_ROW = "flashcache + archive and recall (defaults)"
chat.POLICIES[CHAT_ROW] = ["--when-full", "flashcache"]
CHAT_ROWS = {"full": 8192, CHAT_ROW: 1024, "flashcache, no recall": 1024}  # the C++ program's rows: cells


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, cells, options):
    port = free_port()
    cmd = [sys.executable, "-m", "flashcache.server", "-m", args.model, "-c", str(cells), "-t", str(args.threads),
           "--port", str(port), "--max-tokens", "32", "--chat-format", "llama.cpp",
           "--batch", "128", "--flash-attn", *options]  # the C++ program's chunk and llama.cpp's attention
    proc = subprocess.Popen(cmd, stderr=open(os.path.join(args.work, f"server_{port}.log"), "w"))
    url = f"http://127.0.0.1:{port}/v1"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/models", timeout=1).read()
            return proc, url
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"the server stopped: {' '.join(cmd)}") from None
            time.sleep(0.2)
    raise SystemExit("the server did not start in 120 s")


def timed_reply(request, piece_of):
    """A streamed reply: its text, the time from the request to its first piece and its whole time."""
    t0 = time.perf_counter()
    first, parts = None, []
    for c in request():
        piece = piece_of(c) if c.choices else ""
        if piece and first is None:
            first = time.perf_counter() - t0
        parts.append(piece)
    total = time.perf_counter() - t0
    return "".join(parts), first if first is not None else total, total


def run_server(args, url, turns, stream):
    """Each turn streamed (greedy, 32 tokens at most): replies, time to first token, turn time. The
    "close" stream is a chat on /v1/chat/completions; the "open" one the whole chat so far as one raw
    prompt on /v1/completions, each reply right after its turn (flashcache_chat --turn-end open decodes
    the same text)."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=3600)
    messages, text, replies, ttft, turn_s = [], "", [], [], []
    for turn in turns:
        if stream == "close":
            messages.append({"role": "user", "content": turn})
            reply, first, total = timed_reply(
                lambda: client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=32,
                                                       stream=True),
                lambda c: c.choices[0].delta.content or "")
            messages.append({"role": "assistant", "content": reply})
        else:
            text += CHATML_TURN.format(turn)
            reply, first, total = timed_reply(
                lambda: client.completions.create(model="m", prompt=text, temperature=0, max_tokens=32, stream=True),
                lambda c: c.choices[0].text)
            text += reply
        replies.append(reply)
        ttft.append(first)
        turn_s.append(total)
    return replies, ttft, turn_s


# The two streams: "close" (each reply's end-of-turn tokens decoded: /v1/chat/completions, as every
# OpenAI client sends a chat) and "open" (never decoded: the stream of the 20-turn chat studies, sent
# as one growing raw prompt through /v1/completions).
STREAMS = ("close", "open")
CHATML_TURN = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"  # SmolLM2's template, as llama.cpp writes it


def run_stream(args, split, stream, turns, asks):
    """The C++ program's rows, then the server's, on one stream of one split."""
    rows, tag = [], "" if stream == "close" else " (open turns)"
    for name, cells in CHAT_ROWS.items():
        t0 = time.time()
        d = chat.run(args, name, turns, cells, turn_end=stream)
        found = [code in d["replies"][i] for i, code in asks]
        rows.append({"split": split, "stream": stream, "row": f"C++ chat{tag}: {name}", "cells": cells,
                     "found": sum(found), "of": len(found), "found_by_turn": found,
                     "answers": [d["replies"][i] for i, _ in asks], "wall_s": round(time.time() - t0, 2),
                     "turn_s": None, "ttft_s": None, "replies": d["replies"]})
        print(f"{split} {rows[-1]['row']}: {sum(found)}/5 in {rows[-1]['wall_s']} s", file=sys.stderr, flush=True)
    for (name, (cells, options)), twin in zip(SERVER_ROWS.items(), rows):
        proc, url = start_server(args, cells, options)
        try:
            t0 = time.time()
            replies, ttft, turn_s = run_server(args, url, turns, stream)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        found = [code in replies[i] for i, code in asks]
        rows.append({"split": split, "stream": stream, "row": name + tag, "cells": cells, "found": sum(found),
                     "of": len(found), "found_by_turn": found, "answers": [replies[i] for i, _ in asks],
                     "wall_s": round(time.time() - t0, 2), "turn_s": [round(t, 4) for t in turn_s],
                     "ttft_s": [round(t, 4) for t in ttft], "replies": replies,
                     # turns whose reply is the C++ program's of the same policy and stream, word for word
                     "same_replies_as_cpp": sum(a == b for a, b in zip(replies, twin["replies"]))})
        print(f"{split} {rows[-1]['row']}: {sum(found)}/5 in {rows[-1]['wall_s']} s", file=sys.stderr, flush=True)
    return rows


def main():
    args = rs.study_args(__doc__, "server_facts.json", "/tmp/flashcache_server_facts")
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_split.json")) as f:
        doc = json.load(f)
    words = 100  # run_chat_facts.py's precondition chose 100-word passages (bench/results/llama_chat_facts.json)
    rows = []
    for split_chat in doc["chats"]:
        turns, asks = chat.script(doc, split_chat, words)
        for stream in STREAMS:
            rows += run_stream(args, split_chat["split"], stream, turns, asks)
    out = {"command": "python3 bench/stream/run_server_facts.py " + " ".join(sys.argv[1:]),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "split": "bench/stream/chat_split.json", "threads": args.threads, "passage_words": words,
           "machine": f"{os.cpu_count()} CPUs", "rows": rows}
    rs.write_json(args.out, out)


if __name__ == "__main__":
    main()
