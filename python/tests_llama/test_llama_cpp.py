"""flashcache.llama_cpp.Llama on SmolLM2-135M: a conversation past the context that stock
llama-cpp-python refuses, the resent prefix reused, an edit forgotten from its first token (the
same greedy reply as a fresh model on the edited conversation), refusals that change nothing."""

from __future__ import annotations

import pytest

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def ask(n: int) -> dict:
    return {"role": "user", "content": f"Remember the number {1000 + 7 * n}. Say one short sentence about turn {n}."}


def chat(llm, messages: list[dict], max_tokens: int = 24) -> str:
    out = llm.create_chat_completion(messages=messages, max_tokens=max_tokens, temperature=0)
    return out["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def llm(door, smollm2):
    model = door.Llama(smollm2, n_ctx=256, verbose=False, n_threads=1, seed=0)
    yield model
    model.close()


def test_stock_llama_cpp_python_refuses_what_this_one_serves(door, smollm2):
    import llama_cpp

    with door.model_params_without_extra_buffers():  # the pip build's AMX kernels die on some VMs
        stock = llama_cpp.Llama(smollm2, n_ctx=256, verbose=False, n_threads=1, seed=0)
    ours = door.Llama(smollm2, n_ctx=256, verbose=False, n_threads=1, seed=0)
    messages, refused = [SYSTEM], None
    for n in range(10):
        messages.append(ask(n))
        try:
            chat(stock, messages)
        except ValueError as e:  # "Requested tokens (...) exceed context window of 256"
            refused = str(e)
        reply = chat(ours, messages)
        messages.append({"role": "assistant", "content": reply})
    assert refused is not None and "exceed context window of 256" in refused
    assert ours.n_tokens > 256 and ours.resident_cells() <= 256
    assert ours.archived_cells() > 0
    stock.close()
    ours.close()


def test_the_resent_prefix_is_reused_and_only_the_new_turn_decoded(llm):
    llm.reset()
    messages = [SYSTEM, ask(0)]
    messages.append({"role": "assistant", "content": chat(llm, messages)})
    first = llm.n_tokens
    messages.append(ask(1))
    chat(llm, messages)
    assert llm.last_turn.reused >= first - 1  # the reply's last token was sampled, never decoded
    assert llm.last_turn.forgotten == 0
    assert 0 < llm.last_turn.decoded < 40


def test_an_edited_message_is_forgotten_from_its_first_differing_token(door, smollm2, llm):
    llm.reset()
    messages = [SYSTEM, ask(0)]
    messages.append({"role": "assistant", "content": chat(llm, messages)})
    messages.append(ask(1))
    chat(llm, messages)
    edited = [SYSTEM, ask(5), messages[2], ask(1)]  # the first question changed
    reply = chat(llm, edited)
    assert llm.last_turn.forgotten > 0 and llm.last_turn.reused > 0
    fresh = door.Llama(smollm2, n_ctx=256, verbose=False, n_threads=1, seed=0)
    assert chat(fresh, edited) == reply  # greedy: the edit left no trace of the old branch
    fresh.close()


def test_a_full_context_without_a_policy_refuses_and_keeps_the_conversation(door, smollm2):
    llm = door.Llama(smollm2, n_ctx=128, when_full="none", verbose=False, n_threads=1, seed=0)
    messages = [SYSTEM, ask(0)]
    messages.append({"role": "assistant", "content": chat(llm, messages, 8)})
    kept = llm.n_tokens
    long_turn = {"role": "user", "content": " ".join(["tell me more about numbers"] * 60)}
    with pytest.raises(ValueError, match="the context is full"):
        chat(llm, [*messages, long_turn], 8)
    assert llm.resident_cells() <= llm.cells  # the pieces that fit were decoded, nothing else
    assert llm.n_tokens >= kept
    short = [*messages, {"role": "user", "content": "Thanks."}]
    assert chat(llm, short, 4) is not None  # the conversation goes on from its kept prefix
    assert llm.last_turn.reused >= kept - 1
    llm.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"when_full": "later"}, "when_full 'later' is not one of"),
        ({"logits_all": True}, "logits_all is not supported"),
        ({"n_ctx": 16}, "n_ctx 16"),
    ],
)
def test_bad_settings_are_refused_by_name(door, smollm2, kwargs, message):
    with pytest.raises(ValueError, match=message):
        door.Llama(smollm2, verbose=False, **kwargs)


def test_saved_states_are_refused_by_name(llm):
    with pytest.raises(ValueError, match="set_cache is not supported"):
        llm.set_cache(object())
    with pytest.raises(ValueError, match="load_state is not supported"):
        llm.load_state(None)


def test_gemma3_sliding_window_layers_go_past_the_context(door, gemma3):
    with pytest.raises(ValueError, match="keep their last 512 positions"):
        door.Llama(gemma3, n_ctx=512, verbose=False)
    llm = door.Llama(gemma3, n_ctx=1024, verbose=False, n_threads=1, seed=0)
    passage = " ".join(f"Item {i} of the list is a word that matters to nobody in particular." for i in range(12))
    messages = []
    for n in range(8):
        messages.append({"role": "user", "content": f"{passage} Turn {n}: name one item."})
        messages.append({"role": "assistant", "content": chat(llm, messages, 12)})
    assert llm.n_tokens > 1024 and llm.resident_cells() <= 1024
    llm.close()


def test_llama_cpps_own_template_formats_the_chat_as_llama_server_does(door, smollm2):
    llm = door.Llama(smollm2, n_ctx=256, verbose=False, n_threads=1, chat_format="llama.cpp")
    chat(llm, [{"role": "user", "content": "Hello."}], 2)
    text = llm.detokenize(list(llm.input_ids[: llm.n_tokens]), special=True).decode()
    assert text.startswith("<|im_start|>user\nHello.<|im_end|>\n<|im_start|>assistant\n")  # no default system prompt
    llm.close()


def test_while_the_context_has_room_replies_equal_stock_llama_cpp_pythons(door, smollm2):
    import llama_cpp

    settings = dict(n_ctx=1024, verbose=False, n_threads=1, seed=0)
    with door.model_params_without_extra_buffers():
        stock = llama_cpp.Llama(smollm2, **settings)
    stock.chat_handler = door.llama_cpp_chat_handler(stock)
    ours = door.Llama(smollm2, chat_format="llama.cpp", **settings)
    theirs, mine = [SYSTEM], [SYSTEM]
    for n in range(4):
        theirs.append(ask(n))
        mine.append(ask(n))
        theirs.append({"role": "assistant", "content": chat(stock, theirs, 16)})
        mine.append({"role": "assistant", "content": chat(ours, mine, 16)})
    assert mine == theirs  # greedy, turn by turn: the prefix reuse and the manager change nothing
    assert ours.last_turn.reused > 0
    stock.close()
    ours.close()
