"""Large and oversized bodies on a real server: the cap, and no stall of other callers.

A body over ``max_request_bytes`` gets 413 in OpenAI's shape. A large body under the cap
is parsed and tokenized off the event loop: other requests are answered meanwhile, and
the memory it took is handed back afterwards.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conveyor.fakes.checkpoints import build_tiny_llama
from tests.e2e.conftest import Server, start_server, stop_server

pytestmark = pytest.mark.slow

MAX_REQUEST_BYTES = 8 * 1024 * 1024
LARGE_CHAT_BYTES = 3_000_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    checkpoint = build_tiny_llama(tmp_path_factory.mktemp("large-llama"))
    generate = {"name": "llama", "kind": "generate", "path": str(checkpoint), "device": "cpu",
                "kv_cache_tokens": 2048, "threads": 1}  # fmt: skip
    syn = {"name": "syn", "kind": "synthetic", "batch_latency_ms": 0, "max_queue": 1024}
    config = {"models": [generate, syn], "max_request_bytes": MAX_REQUEST_BYTES}
    running = start_server(tmp_path_factory.mktemp("large-server"), config)
    yield running
    stop_server(running)


def rss_mb(server: Server) -> float:
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def test_a_declared_body_over_the_cap_is_413(server: Server) -> None:
    body = json.dumps({"model": "syn", "input": "x" * MAX_REQUEST_BYTES}).encode()
    response = httpx.post(f"{server.api}/embeddings", content=body,
                          headers={"content-type": "application/json"})  # fmt: skip
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "request_too_large"
    assert "max_request_bytes" in error["message"]


def test_a_client_that_sends_its_whole_oversized_body_sees_the_413(server: Server) -> None:
    """Answered at the head, the rest of the body is read and dropped before the connection
    closes: closing on unread bytes resets the connection, and the 413 may be lost with it."""
    port = int(server.url.rsplit(":", 1)[1])
    size = MAX_REQUEST_BYTES + (1 << 20)
    head = b"POST /v1/embeddings HTTP/1.1\r\nHost: conveyor\r\nContent-Type: application/json\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + b"Content-Length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):  # no reset on the way: the server read it all
            sock.sendall(b"x" * 65536)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "request_too_large"


def test_a_chunked_body_over_the_cap_is_413(server: Server) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "syn", "input": "'
        for _ in range(MAX_REQUEST_BYTES // 65536 + 1):
            yield b"x" * 65536
        yield b'"}'

    response = httpx.post(f"{server.api}/embeddings", content=chunks(),
                          headers={"content-type": "application/json"})  # fmt: skip
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "request_too_large"


def test_a_body_under_the_cap_is_served(server: Server) -> None:
    words = " ".join(["w"] * 60)
    response = httpx.post(f"{server.api}/embeddings", json={"model": "syn", "input": [words] * 500})
    assert response.status_code == 200, response.text
    assert len(response.json()["data"]) == 500


def test_a_small_request_is_answered_while_a_large_body_is_in_progress(server: Server) -> None:
    """Most of a large body is in while its last bytes are held back: the request is in
    progress on the server the whole time the small requests are sent and answered."""
    inputs = ["w" * 10_000] * 500  # one token each, 5 MB in all
    body = json.dumps({"model": "syn", "input": inputs}).encode()
    large = http.client.HTTPConnection(server.url.removeprefix("http://"), timeout=60)
    large.putrequest("POST", "/v1/embeddings")
    large.putheader("Content-Type", "application/json")
    large.putheader("Content-Length", str(len(body)))
    large.endheaders(body[:-10])
    with httpx.Client(base_url=server.api, timeout=10) as client:
        small = [client.post("/embeddings", json={"model": "syn", "input": f"hi {i}"})
                 for i in range(5)]  # fmt: skip
    assert [r.status_code for r in small] == [200] * 5
    assert large.sock is not None
    large.sock.settimeout(0.5)  # no answer yet: the large request still waits for its body
    with pytest.raises(TimeoutError):
        large.sock.recv(1, socket.MSG_PEEK)
    large.sock.settimeout(60)
    large.send(body[-10:])
    response = large.getresponse()
    assert response.status == 200
    assert len(json.loads(response.read())["data"]) == len(inputs)
    large.close()


def test_a_chat_body_longer_than_the_context_is_refused_without_tokenizing(
    server: Server,
) -> None:
    """Megabytes of prompt are refused from their length alone: no seconds of tokenizing,
    no millions of token ids holding the interpreter lock or the memory."""
    content = "hello world " * (LARGE_CHAT_BYTES // 12)
    body = {"model": "llama", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    before_mb = rss_mb(server)
    response = httpx.post(f"{server.api}/chat/completions", json=body, timeout=120)
    assert response.status_code == 400
    error = response.json()["error"]
    assert "at least" in error["message"] and error["param"] == "messages"
    small = httpx.post(f"{server.api}/embeddings", json={"model": "syn", "input": "hi"})
    assert small.status_code == 200
    assert rss_mb(server) - before_mb < 100, "the large request's memory was not handed back"


def test_a_prompt_just_over_the_context_is_counted_exactly(server: Server) -> None:
    """Under the length bound, the prompt is tokenized and its exact size reported."""
    body = {"model": "llama", "prompt": "hello world " * 600, "max_tokens": 1}
    response = httpx.post(f"{server.api}/completions", json=body, timeout=60)
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "maximum context length" in message and "at least" not in message


def test_more_inputs_than_the_queue_holds_is_400_not_429(server: Server) -> None:
    response = httpx.post(f"{server.api}/embeddings",
                          json={"model": "syn", "input": ["a"] * 1025})  # fmt: skip
    assert response.status_code == 400, response.text
    assert "too many inputs" in response.json()["error"]["message"]


def test_more_prompts_than_the_queue_holds_is_400_not_429(server: Server) -> None:
    response = httpx.post(f"{server.api}/completions",
                          json={"model": "llama", "prompt": ["a"] * 1025, "max_tokens": 1})  # fmt: skip
    assert response.status_code == 400, response.text
    assert "too many prompts" in response.json()["error"]["message"]
