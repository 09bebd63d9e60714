"""llama-cpp-python with a context that never runs out: ``flashcache.llama_cpp.Llama``.

A subclass of llama-cpp-python's ``Llama`` (pinned: 0.3.36, the ``llama`` extra) whose context
makes room when it fills instead of raising. Before every decode the C++ ``ContextManager``
(flashcache's llama.cpp adapter, on the very ``llama_context`` llama-cpp-python made) hears how
many tokens come; when they do not fit it compacts the conversation with FlashCache (or drops
old cells: ``when_full="shift"`` or ``"streaming"``), keeps what it evicts in an archive, and at
each new turn brings back the archived cells the turn's own queries point to::

    from flashcache.llama_cpp import Llama
    llm = Llama("model.gguf", n_ctx=1024)              # the context: 1,024 cells, for ever
    llm.create_chat_completion(messages=[...])          # the OpenAI habit: resend everything

A request that resends the conversation (as OpenAI clients do) decodes only what is new: the
longest prefix already decoded is kept, the rest is forgotten from the first differing token on
(an edited message; the archive drops what it held there, and says so), and the new tokens are
one turn: protected while the reply is written, and the queries that recall.

Not supported here, refused by name: ``logits_all`` (logprobs), ``set_cache`` / ``load_state``
(a saved state does not carry the archive), LoRA adapters and draft models.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

try:
    import llama_cpp
    from llama_cpp import _internals as _llama_internals
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        "flashcache.llama_cpp needs llama-cpp-python 0.3.36: "
        'CMAKE_ARGS=-DLLAVA_BUILD=OFF python3 -m pip install "llama-cpp-python==0.3.36"'
    ) from e

import numpy as np

log = logging.getLogger("flashcache.llama_cpp")

# chat_format: llama.cpp's own formatting of the model's template (llama_chat_apply_template, as
# llama.cpp's simple-chat and llama-server without --jinja apply it) instead of llama-cpp-python's
# Jinja rendering of it, which may add text (SmolLM2's adds a default system prompt).
LLAMA_CPP_TEMPLATE = "llama.cpp"


def _door() -> Any:
    """flashcache._llama, once llama_cpp has loaded its libllama: the module must use that copy."""
    try:
        from flashcache import _llama
    except ImportError as e:
        raise ImportError(
            "flashcache.llama_cpp: this flashcache was built without its llama.cpp door (flashcache._llama); "
            "install llama-cpp-python==0.3.36 first, then flashcache with --no-build-isolation"
        ) from e
    ours = os.path.realpath(_llama.library_path())
    theirs = os.path.realpath(getattr(llama_cpp.llama_cpp._lib, "_name", "") or "")
    if ours != theirs:
        raise ImportError(
            f"flashcache.llama_cpp: two libllama in one process: flashcache._llama uses {ours}, "
            f"llama_cpp loaded {theirs}; rebuild flashcache against this llama-cpp-python"
        )
    return _llama


_door_module = _door()  # importing this module says so when flashcache was built without its door
WHEN_FULL = _door_module.when_full_choices  # the C++ policies' names, from their one table


def llama_cpp_chat_handler(llm: Any) -> Any:
    """A chat handler that formats messages with llama.cpp's built-in template for the model."""
    from llama_cpp import llama_chat_format

    template = llama_cpp.llama_model_chat_template(llm._model.model, None)
    if template is None:
        raise ValueError('flashcache.llama_cpp: chat_format="llama.cpp": the model has no chat template')

    def format_messages(messages: list[dict], **_: Any) -> Any:
        chat = (llama_cpp.llama_chat_message * len(messages))()
        contents = [(m["role"].encode(), (m.get("content") or "").encode()) for m in messages]
        for i, (role, content) in enumerate(contents):
            chat[i].role, chat[i].content = role, content
        size = llama_cpp.llama_chat_apply_template(template, chat, len(messages), True, None, 0)
        if size < 0:
            raise ValueError("flashcache.llama_cpp: llama.cpp does not know this model's chat template")
        buf = ctypes.create_string_buffer(size + 1)
        llama_cpp.llama_chat_apply_template(template, chat, len(messages), True, buf, size + 1)
        return llama_chat_format.ChatFormatterResponse(prompt=buf.value.decode("utf-8"))  # BOS as the vocab says

    return llama_chat_format.chat_formatter_to_chat_completion_handler(format_messages)


@contextlib.contextmanager
def model_params_without_extra_buffers() -> Generator[None, None, None]:
    """llama-cpp-python's Llama made inside this block loads its weights without llama.cpp's extra
    buffer types (weight repacking, AMX). The pip package's ggml is built for the machine that built
    it; on a VM whose CPU lists AMX without allowing it, the repacked kernels die with SIGILL at the
    first matrix product (the project's C++ programs turn them off for the same reason). llama-cpp-
    python sets no such option, so its default parameters are wrapped for the duration."""
    module = llama_cpp.llama_cpp
    original = module.llama_model_default_params

    def without_extra_buffers() -> Any:
        params = original()
        params.use_extra_bufts = False
        return params

    module.llama_model_default_params = without_extra_buffers
    try:
        yield
    finally:
        module.llama_model_default_params = original


@dataclass
class TurnStats:
    """What the last turn did: tokens reused and decoded, what was forgotten, room made, recalled."""

    reused: int = 0
    decoded: int = 0
    forgotten: int = 0
    archive_dropped: int = 0
    events: int = 0
    recalled: int = 0


class Llama(llama_cpp.Llama):
    """llama-cpp-python's ``Llama`` on a context that makes room when it fills.

    Args (besides llama-cpp-python's own, passed through):
        when_full: ``"flashcache"`` (default: compact by FlashCache, the evicted cells archived),
            ``"shift"`` (llama.cpp's context shift), ``"streaming"`` (StreamingLLM) or ``"none"``
            (refuse, as llama-cpp-python does).
        n_keep: the first cells that always stay (the system prompt's start; default 4).
        target: flashcache compacts to this share of the cells (default 0.75).
        archive: flashcache keeps the evicted cells for recall (default True; positions then grow
            past ``n_ctx``, and past the model's training length the cells are renumbered and the
            archive is dropped, counted).
        recall: archived cells a new turn may bring back (default 64; 0: none).
        threads: scoring threads (default: the context's).
        extra_buffer_types: llama.cpp's weight repacking (AMX and others) as llama-cpp-python would use
            it; off by default (see model_params_without_extra_buffers).
    """

    def __init__(
        self,
        model_path: str,
        *,
        n_ctx: int = 1024,
        when_full: str = "flashcache",
        n_keep: int = 4,
        target: float = 0.75,
        archive: bool = True,
        recall: int = 64,
        threads: int = 0,
        extra_buffer_types: bool = False,
        **kwargs: Any,
    ) -> None:
        self._stack = contextlib.ExitStack()  # what llama_cpp.Llama.__del__ closes, should a check below refuse
        if when_full not in WHEN_FULL:
            raise ValueError(f"flashcache.llama_cpp: when_full {when_full!r} is not one of {', '.join(WHEN_FULL)}")
        for name in ("logits_all", "lora_path", "draft_model"):
            if kwargs.get(name):
                raise ValueError(f"flashcache.llama_cpp: {name} is not supported with a compressing context")
        if n_ctx < 64:
            raise ValueError(f"flashcache.llama_cpp: n_ctx {n_ctx} (at least 64 cells)")
        builtin_template = kwargs.get("chat_format") == LLAMA_CPP_TEMPLATE
        if builtin_template:
            kwargs.pop("chat_format")
        # A long prompt goes in pieces that each fit the room the manager makes.
        kwargs.setdefault("n_batch", min(512, n_ctx // 4))
        kwargs.setdefault("n_ubatch", kwargs["n_batch"])
        if extra_buffer_types:
            super().__init__(model_path, n_ctx=n_ctx, **kwargs)
        else:
            with model_params_without_extra_buffers():
                super().__init__(model_path, n_ctx=n_ctx, **kwargs)
        n_swa = llama_cpp.llama_model_n_swa(self._model.model)
        if when_full != "none" and n_swa > 0 and round(target * self.n_ctx()) <= n_swa:
            raise ValueError(
                f"flashcache.llama_cpp: this model's sliding-window layers keep their last {n_swa} positions, "
                f"more than {target} of {self.n_ctx()} cells: use n_ctx above {int(n_swa / target)}"
            )
        self._session = _door_module.Session()
        self.recall_cells = recall if (when_full == "flashcache" and archive) else 0
        if self.recall_cells > 0:  # the turn's queries come through cb_eval, set when the context is made
            self._remake_context_with_capture()
        params = _door_module.SessionParams()
        params.when_full, params.n_keep, params.target = when_full, n_keep, target
        params.archive, params.recall, params.threads = archive, self.recall_cells, threads
        self._session.init(ctypes.cast(self._ctx.ctx, ctypes.c_void_p).value, params)
        if builtin_template:
            self.chat_handler = llama_cpp_chat_handler(self)
        self.when_full, self.n_keep = when_full, n_keep
        self.cells = self._session.cap
        # The conversation has no length limit here; the context's cells are `cells`.
        self._n_ctx = 2**31 - 1
        self._exact_from, self._delta = 0, 0  # history index i sits at position i + delta from exact_from on
        self.last_turn = TurnStats()

    # ---- the context -------------------------------------------------------------------------
    def _remake_context_with_capture(self) -> None:
        """The context again, with the query capture on its cb_eval (llama-cpp-python sets no hook)."""
        self._ctx.close()
        self.context_params.cb_eval = llama_cpp.ggml_backend_sched_eval_callback(self._session.eval_address)
        self.context_params.cb_eval_user_data = ctypes.c_void_p(self._session.capture_address)
        self._ctx = _llama_internals.LlamaContext(model=self._model, params=self.context_params, verbose=self.verbose)
        self._stack.callback(self._ctx.close)

    def turn_limit(self) -> int:
        """The most new tokens one turn may bring: the cells less n_keep and a quarter for the reply."""
        return self.cells - self.n_keep - self.cells // 4

    def resident_cells(self) -> int:
        return self._session.cells

    def archived_cells(self) -> int:
        return self._session.archive_tokens

    def set_cache(self, cache: Any) -> None:
        if cache is not None:
            raise ValueError("flashcache.llama_cpp: set_cache is not supported (a saved state has no archive)")

    def load_state(self, state: Any) -> None:
        raise ValueError("flashcache.llama_cpp: load_state is not supported (a saved state has no archive)")

    def reset(self) -> None:
        """Forgets the whole conversation: the cells and the archive."""
        self._forget_from(0)

    # ---- decoding ----------------------------------------------------------------------------
    def eval(self, tokens: Sequence[int]) -> None:
        """Decodes tokens after the ones already decoded, where the manager makes room for them."""
        for i in range(0, len(tokens), self.n_batch):
            batch = list(tokens[i : i + self.n_batch])
            index = self.n_tokens
            pos, event = self._session.make_room(len(batch))
            if event["policy"] != "none":
                self.last_turn.events += 1
                log.info(
                    "room made (%s): %d -> %d cells, %d archived, %.0f ms%s",
                    event["policy"],
                    event["cells_before"],
                    event["cells_after"],
                    event["archived"],
                    event["ms"],
                    f", positions restarted ({event['restart_dropped']} cells dropped)" if event["restarted"] else "",
                )
            if pos - index != self._delta:  # cells renumbered (or a gap): older indices no longer map
                self._exact_from, self._delta = index, pos - index
            self._batch.set_batch(batch=batch, n_past=pos, logits_all=False)
            self._ctx.decode(self._batch)
            if index + len(batch) > len(self.input_ids):
                grown = np.ndarray((max(2 * len(self.input_ids), index + len(batch)),), dtype=np.intc)
                grown[:index] = self.input_ids[:index]
                self.input_ids = grown
            self.input_ids[index : index + len(batch)] = batch
            self.n_tokens = index + len(batch)
            self._requires_eval = False

    def reused_prefix(self, tokens: Sequence[int]) -> int:
        """How many of a prompt's tokens `generate` reuses: the longest prefix already decoded (one token at
        least is decoded again, for fresh logits), or 0 when it differs where compaction renumbered
        positions (the conversation starts again)."""
        history, same = self.input_ids[: self.n_tokens], 0
        limit = min(len(history), len(tokens) - 1)
        while same < limit and history[same] == tokens[same]:
            same += 1
        return 0 if same < min(self.n_tokens, self._exact_from) else same

    def _forget_from(self, index: int) -> None:
        """History from `index` on is dropped: its cells, and the archive's blocks there."""
        if index >= self.n_tokens:
            return
        if index < self._exact_from:  # positions there were renumbered: start the conversation again
            index, pos = 0, 0
        else:
            pos = index + self._delta
        dropped = self._session.forget_from(pos)
        self.last_turn.forgotten += self.n_tokens - index
        self.last_turn.archive_dropped += dropped
        log.info(
            "forgot %d tokens from token %d (position %d); the archive dropped %d",
            self.n_tokens - index,
            index,
            pos,
            dropped,
        )
        self.n_tokens = index
        self._requires_eval = True
        if index == 0:
            self._exact_from, self._delta = 0, 0

    def _decode_turn(self, new: list[int]) -> int:
        """New tokens as one turn: all but its last `turn_limit` decoded first, unprotected. Returns
        the turn's length."""
        limit = self.turn_limit()
        head = max(0, len(new) - limit)
        if head:
            self._session.protect_from(-1)
            self.eval(new[:head])
        self._session.begin_turn()
        self.eval(new[head:])
        if self.recall_cells > 0:
            stats = self._session.recall_turn(new[head:])
            self.last_turn.recalled = stats["recalled"]
            if stats["recalled"]:
                log.info(
                    "recalled %d of %d archived cells by %d queries (%d displaced, %d redecoded), %.0f ms",
                    stats["recalled"],
                    stats["archive_tokens"],
                    stats["queries"],
                    stats["displaced"],
                    stats["redecoded"],
                    stats["ms"],
                )
        return len(new) - head

    def generate(  # noqa: C901 - llama-cpp-python's signature
        self,
        tokens: Sequence[int],
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        temp: float = 0.80,
        repeat_penalty: float = 1.0,
        reset: bool = True,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        penalize_nl: bool = True,
        logits_processor: Any = None,
        stopping_criteria: Any = None,
        grammar: Any = None,
    ) -> Generator[int, Sequence[int] | None, None]:
        """llama-cpp-python's generate, on a conversation of any length: the prompt's prefix already
        decoded is reused, the rest decoded as one turn (with recall), then tokens are sampled."""
        self._mirostat_mu = ctypes.c_float(2.0 * mirostat_tau)
        self._sampler = self._init_sampler(
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            typical_p=typical_p,
            temp=temp,
            repeat_penalty=repeat_penalty,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            tfs_z=tfs_z,
            mirostat_mode=mirostat_mode,
            mirostat_tau=mirostat_tau,
            mirostat_eta=mirostat_eta,
            penalize_nl=penalize_nl,
            logits_processor=logits_processor,
            grammar=grammar,
        )
        tokens = list(tokens)
        if not tokens:
            raise ValueError("flashcache.llama_cpp: an empty prompt")
        self.last_turn = TurnStats()
        new = tokens  # reset=False: the tokens follow what is decoded
        if reset:
            self._forget_from(self.reused_prefix(tokens))
            new = tokens[self.n_tokens :]  # all of the prefix is left, or none after a restart
        self.last_turn.reused = self.n_tokens
        self.last_turn.decoded = len(new)
        turn = self._decode_turn(new)
        # The turn and its reply stay resident together: the reply ends when they would not fit.
        reply_room = self.cells - self.n_keep - 1 - self.recall_cells - turn
        for _ in range(max(reply_room, 1)):
            token = self.sample()  # with the sampler made above
            if stopping_criteria is not None:
                last = llama_cpp.llama_get_logits_ith(self._ctx.ctx, -1)
                logits = np.ctypeslib.as_array(last, shape=(self._n_vocab,))
                if stopping_criteria(self._input_ids, logits):
                    return
            more = yield token
            self.eval([token, *(more or [])])
        log.info("the reply stopped at %d tokens: the turn and its reply fill the context", reply_room)
