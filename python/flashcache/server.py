"""An OpenAI-compatible chat server whose context never runs out.

    python -m flashcache.server --model model.gguf -c 1024            # http://127.0.0.1:8000/v1

Serves ``/v1/chat/completions`` (streaming and not), ``/v1/completions`` and ``/v1/models`` with one
``flashcache.llama_cpp.Llama``: when the conversation outgrows the context it is compacted (FlashCache,
the evicted cells archived) and each new turn recalls what it asks about. Clients resend the whole
conversation, as OpenAI clients do; what was already decoded is reused.

Built on the standard library's ``http.server`` (no web framework to install): one model serves one
request at a time, so requests from several clients wait in turn for it (a lock), never interleaved
on one context. Bad requests get a 400 that names the field; a message longer than a turn may be
gets a 400 that names the limit. The log has a line per request, compaction and recall.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("flashcache.server")

ROLES = ("system", "user", "assistant")


class BadRequest(ValueError):
    """A request the server refuses with a 400: `param` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _number(body: dict, name: str, kind: type, low: float, high: float | None = None) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise BadRequest(f"'{name}' must be a{'n integer' if kind is int else ' number'}, not {value!r}", name)
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise BadRequest(f"'{name}' must be {bound}, not {value!r}", name)
    return kind(value)


def sampling(body: dict) -> dict:
    """The sampling fields a request may set, checked: llama-cpp-python's keyword arguments."""
    out: dict[str, Any] = {}
    for name, kind, low, high in (
        ("max_tokens", int, 1, None),
        ("temperature", float, 0.0, 2.0),
        ("top_p", float, 0.0, 1.0),
        ("seed", int, 0, None),
        ("presence_penalty", float, -2.0, 2.0),
        ("frequency_penalty", float, -2.0, 2.0),
        ("repeat_penalty", float, 0.0, 2.0),
    ):
        value = _number(body, name, kind, low, high)
        if value is not None:
            out[name] = value
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise BadRequest("'stop' must be a string or a list of strings", "stop")
        out["stop"] = stop
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be true or false, not {stream!r}", "stream")
    out["stream"] = stream
    return out


def chat_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of {role, content}", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest(f"messages[{i}].role must be one of {', '.join(ROLES)}", f"messages[{i}].role")
        if not isinstance(m.get("content"), str):
            raise BadRequest(f"messages[{i}].content must be a string", f"messages[{i}].content")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


class Service:
    """The model behind the endpoints: one request at a time."""

    def __init__(self, llm: Any, model_name: str, max_tokens: int) -> None:
        self.llm, self.model_name, self.max_tokens = llm, model_name, max_tokens
        self.lock = threading.Lock()

    def check_lengths(self, texts: list[tuple[str, str]]) -> None:
        """Each message must fit one turn of the context: a 400 naming the limit otherwise."""
        limit = self.llm.turn_limit()
        for where, text in texts:
            data = text.encode("utf-8")
            if len(data) <= limit:  # a token holds one byte at least: no need to tokenize
                continue
            n = len(self.llm.tokenize(data, add_bos=False, special=True))
            if n > limit:
                raise BadRequest(
                    f"{where} is {n} tokens; this server's context of {self.llm.cells} cells takes at most {limit} "
                    "tokens per message (-c sets the cells)",
                    where,
                )

    def run(self, kind: str, body: dict) -> tuple[Any, dict]:
        """The llama-cpp-python call for a checked request (its result or chunk iterator) and its settings."""
        opts = sampling(body)
        opts.setdefault("max_tokens", self.max_tokens)
        opts["model"] = self.model_name
        if kind == "chat":
            messages = chat_messages(body)
            self.check_lengths([(f"messages[{i}].content", m["content"]) for i, m in enumerate(messages)])
            return self.llm.create_chat_completion(messages=messages, **opts), opts
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise BadRequest("'prompt' must be a non-empty string", "prompt")
        tokens = self.llm.tokenize(prompt.encode("utf-8"), special=True)  # as create_completion would
        self.check_new_tokens(tokens)
        return self.llm.create_completion(prompt=tokens, **opts), opts  # tokenized once

    def check_new_tokens(self, tokens: list[int]) -> None:
        """A resent prompt grows past the context: what it adds to the tokens already decoded must fit
        one turn (a 400 naming the limit otherwise)."""
        limit = self.llm.turn_limit()
        reused = self.llm.reused_prefix(tokens)
        if len(tokens) - reused > limit:
            raise BadRequest(
                f"prompt adds {len(tokens) - reused} tokens to the {reused} this server has decoded; its context "
                f"of {self.llm.cells} cells takes at most {limit} new tokens per request (-c sets the cells)",
                "prompt",
            )

    def note(self, kind: str, started: float) -> None:
        t = self.llm.last_turn
        log.info(
            "%s: %d tokens reused, %d decoded, %d forgotten, %d compactions, %d recalled; %d cells resident, "
            "%d archived; %.2f s",
            kind,
            t.reused,
            t.decoded,
            t.forgotten,
            t.events,
            t.recalled,
            self.llm.resident_cells(),
            self.llm.archived_cells(),
            time.perf_counter() - started,
        )


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "flashcache"
    service: Service  # set on the class made by make_server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("%s %s", self.address_string(), format % args)

    def send_json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_error_json(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        self.send_json(status, {"error": {"message": message, "type": kind, "param": param, "code": None}})

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.rstrip("/") == "/v1/models":
            model = {"id": self.service.model_name, "object": "model", "created": 0, "owned_by": "flashcache"}
            self.send_json(200, {"object": "list", "data": [model]})
        else:
            self.send_error_json(404, f"no endpoint {self.path}", kind="not_found_error")

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        kind = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}.get(self.path.rstrip("/"))
        if kind is None:
            self.send_error_json(404, f"no endpoint {self.path}", kind="not_found_error")
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"null")
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
        except (ValueError, json.JSONDecodeError) as e:
            self.send_error_json(400, str(e) if isinstance(e, BadRequest) else f"the request body is not JSON: {e}")
            return
        started = time.perf_counter()
        with self.service.lock:  # one request at a time on the one context
            try:
                result, opts = self.service.run(kind, body)
                if opts["stream"]:
                    self.stream(result)
                else:
                    self.send_json(200, result)
            except BadRequest as e:
                self.send_error_json(400, str(e), e.param)
                return
            except Exception as e:  # the library refused or failed: the conversation is as it was
                log.exception("%s failed", kind)
                self.send_error_json(500, f"{type(e).__name__}: {e}", kind="server_error")
                return
            self.service.note(kind, started)

    def stream(self, chunks: Iterator[dict]) -> None:
        """Server-sent events, one chunk each, then [DONE]; a client gone mid-stream ends the reply
        there (what was decoded stays, the rest of the reply is not generated)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            for chunk in chunks:
                self.wfile.write(b"data: " + json.dumps(chunk).encode("utf-8") + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            log.info("the client left mid-stream; the reply stops there")
        except Exception as e:  # after the headers: the error goes as the stream's last event
            log.exception("the stream failed")
            error = {"error": {"message": f"{type(e).__name__}: {e}", "type": "server_error", "param": None}}
            try:
                self.wfile.write(b"data: " + json.dumps(error).encode("utf-8") + b"\n\n")
            except OSError:
                pass
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()


def make_server(llm: Any, host: str, port: int, model_name: str, max_tokens: int = 512) -> ThreadingHTTPServer:
    """The HTTP server for a model (port 0: any free port; server.server_address says which)."""
    handler = type("BoundHandler", (Handler,), {"service": Service(llm, model_name, max_tokens)})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> int:
    from flashcache.llama_cpp import WHEN_FULL, Llama

    p = argparse.ArgumentParser(
        prog="python -m flashcache.server", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", "-m", required=True, help="the GGUF file")
    p.add_argument("--n-ctx", "-c", type=int, default=1024, help="the context's cells (default 1024)")
    p.add_argument("--when-full", default="flashcache", choices=WHEN_FULL)
    p.add_argument("--n-keep", type=int, default=4, help="first cells always kept (default 4)")
    p.add_argument("--recall", type=int, default=64, help="archived cells a turn may bring back (default 64; 0: none)")
    p.add_argument("--no-archive", action="store_true", help="flashcache: drop the evicted cells (no recall)")
    p.add_argument(
        "--threads",
        "-t",
        type=int,
        default=None,
        help="llama.cpp threads, for decoding and prompts (default: llama-cpp-python's)",
    )
    p.add_argument("--max-tokens", type=int, default=512, help="a reply's tokens when a request sets none")
    p.add_argument(
        "--chat-format",
        default=None,
        help="llama-cpp-python's chat format (default: its rendering of the "
        "GGUF's template), or llama.cpp: llama.cpp's own formatting of that template, as llama-server's",
    )
    p.add_argument("--batch", type=int, default=None, help="tokens per decode (default: a quarter of -c, at most 512)")
    p.add_argument("--flash-attn", action="store_true", help="llama.cpp's flash attention (llama-cpp-python: off)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--name", default=None, help="the model's id in /v1/models (default: the file's name)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    extra = {"n_threads": args.threads, "n_threads_batch": args.threads} if args.threads else {}
    if args.batch:
        extra.update(n_batch=args.batch, n_ubatch=args.batch)
    if args.flash_attn:
        extra["flash_attn"] = True
    llm = Llama(
        args.model,
        n_ctx=args.n_ctx,
        when_full=args.when_full,
        n_keep=args.n_keep,
        recall=args.recall,
        archive=not args.no_archive,
        chat_format=args.chat_format,
        seed=args.seed,
        verbose=False,
        **extra,
    )
    name = args.name or args.model.rsplit("/", 1)[-1]
    server = make_server(llm, args.host, args.port, name, args.max_tokens)
    host, port = server.server_address[:2]
    log.info(
        "serving %s on http://%s:%d/v1 (%d cells, when full: %s, recall %d)",
        name,
        host,
        port,
        llm.cells,
        args.when_full,
        llm.recall_cells,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
