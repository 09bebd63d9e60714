"""flashcache.server with a real client (the openai package) on SmolLM2-135M: a 40-turn conversation
through 1,024 cells, streaming equal to the plain reply, two clients at once, a client that leaves
mid-stream, and the malformed requests refused by name."""

from __future__ import annotations

import http.client
import json
import threading

import pytest
from conftest import Running

openai = pytest.importorskip("openai", reason="the openai package is not installed (pip install openai)")


@pytest.fixture(scope="module")
def server(door, smollm2):
    llm = door.Llama(smollm2, n_ctx=1024, verbose=False, n_threads=1, seed=0)
    running = Running(llm, max_tokens=32)
    yield running
    running.stop()
    llm.close()


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=600)


def reply(client, messages, **kw):
    out = client.chat.completions.create(model="test-model", messages=messages, temperature=0, **kw)
    return out.choices[0].message.content


def post(server, path: str, body: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    conn.request("POST", path, body=body, headers={"Content-Type": content_type})
    response = conn.getresponse()
    payload = json.loads(response.read() or b"{}")
    conn.close()
    return response.status, payload


def test_forty_turns_through_1024_cells_without_an_error(server, client):
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    for n in range(40):
        messages.append(
            {
                "role": "user",
                "content": f"Note {n}: the code of drawer {n} is {1000 + 37 * n}. "
                "Tell me one short thing about drawers.",
            }
        )
        messages.append({"role": "assistant", "content": reply(client, messages, max_tokens=24)})
    llm = server.llm
    assert llm.n_tokens > 1024 and llm.resident_cells() <= 1024
    assert llm.archived_cells() > 0
    assert llm.last_turn.reused > 1024  # the resent conversation was not decoded again


def test_models_and_completions(server, client):
    assert [m.id for m in client.models.list().data] == ["test-model"]
    out = client.completions.create(model="test-model", prompt="The capital of France is", max_tokens=4, temperature=0)
    assert out.choices[0].text


def test_a_streamed_reply_equals_the_plain_one(client):
    messages = [{"role": "user", "content": "Name three colours."}]
    # Both compared replies start from the same cache: the prompt decoded once before them and reused
    # by each. A prompt decoded in one batch and the same prompt's last token decoded alone differ in
    # llama.cpp's float sums, enough to flip a near tie in greedy decoding.
    reply(client, messages, max_tokens=16)
    plain = reply(client, messages, max_tokens=16)
    chunks = client.chat.completions.create(
        model="test-model", messages=messages, temperature=0, max_tokens=16, stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == plain


def test_two_clients_at_once_are_served_in_turn(server):
    errors, replies = [], {}

    def talk(name: str) -> None:
        own = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=600)
        messages = []
        try:
            for n in range(3):
                messages.append({"role": "user", "content": f"I am {name}. Say hello to {name} ({n})."})
                messages.append({"role": "assistant", "content": reply(own, messages, max_tokens=12)})
            replies[name] = messages
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors.append(repr(e))

    threads = [threading.Thread(target=talk, args=(name,)) for name in ("Ada", "Bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert set(replies) == {"Ada", "Bob"} and all(len(m) == 6 for m in replies.values())


def test_a_client_that_leaves_mid_stream_leaves_the_context_usable(server, client):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    body = {"messages": [{"role": "user", "content": "Count from one to fifty."}], "stream": True, "max_tokens": 64}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    assert response.fp.readline().startswith(b"data: ")
    response.close()  # gone, mid-stream
    conn.close()
    assert reply(client, [{"role": "user", "content": "Say yes."}], max_tokens=4)


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({}, "messages", "'messages' must be a non-empty list"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", "must be one of"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "must be a string"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature", "must be a number"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens", "at least 1"),
        ({"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream", "true or false"),
        ({"messages": [{"role": "user", "content": "hi"}], "stop": 3}, "stop", "a string or a list"),
    ],
)
def test_malformed_requests_get_a_400_naming_the_field(server, body, param, message):
    status, payload = post(server, "/v1/chat/completions", json.dumps(body).encode())
    assert status == 400
    assert payload["error"]["param"] == param and message in payload["error"]["message"]


def test_a_message_longer_than_a_turn_gets_a_400_naming_the_limit(server):
    long_text = " ".join(["word"] * 2000)
    status, payload = post(
        server, "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": long_text}]}).encode()
    )
    assert status == 400
    limit = server.llm.turn_limit()
    assert payload["error"]["param"] == "messages[0].content"
    assert f"takes at most {limit} tokens per message" in payload["error"]["message"]


def test_a_resent_prompt_grows_past_the_context_and_only_what_it_adds_is_limited(server):
    # /v1/completions with the whole text so far each time, as a completion client resends it.
    text = ""
    for n in range(8):
        text += f" Part {n}: " + " ".join(["the river runs past the mill"] * 25)  # ~180 tokens a part
        status, payload = post(server, "/v1/completions", json.dumps({"prompt": text, "max_tokens": 4}).encode())
        assert status == 200, payload
        text += payload["choices"][0]["text"]
    llm = server.llm
    assert llm.n_tokens > 1024 and llm.resident_cells() <= 1024
    assert llm.last_turn.reused > 1024
    limit = llm.turn_limit()
    status, payload = post(
        server, "/v1/completions", json.dumps({"prompt": text + " word" * 2000, "max_tokens": 4}).encode()
    )
    assert status == 400 and payload["error"]["param"] == "prompt"
    assert f"takes at most {limit} new tokens per request" in payload["error"]["message"]


def test_bodies_that_are_not_json_objects_and_unknown_paths(server):
    status, payload = post(server, "/v1/chat/completions", b"{not json")
    assert status == 400 and "not JSON" in payload["error"]["message"]
    status, payload = post(server, "/v1/chat/completions", b"[1, 2]")
    assert status == 400 and "a JSON object" in payload["error"]["message"]
    status, payload = post(server, "/v1/embeddings", b"{}")
    assert status == 404


def test_gemma3_through_the_server_past_its_context(door, gemma3):
    llm = door.Llama(gemma3, n_ctx=1024, verbose=False, n_threads=1, seed=0)
    running = Running(llm, max_tokens=12)
    try:
        client = openai.OpenAI(base_url=running.url, api_key="none", max_retries=0, timeout=600)
        passage = " ".join(f"Line {i} of the log says that nothing happened at all." for i in range(12))
        messages = []
        for n in range(7):
            messages.append({"role": "user", "content": f"{passage} Turn {n}: which line is first?"})
            messages.append({"role": "assistant", "content": reply(client, messages, max_tokens=12)})
        assert llm.n_tokens > 1024 and llm.resident_cells() <= 1024
        assert llm.last_turn.reused > 0
    finally:
        running.stop()
        llm.close()
