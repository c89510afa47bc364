"""Every malformed request gets the right 4xx and message; the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.conftest import Server

pytestmark = pytest.mark.slow

CASES = [
    ({"model": "syn", "input": ""}, 400, "empty"),
    ({"model": "syn", "input": []}, 400, "empty"),
    ({"model": "syn", "input": ["ok", ""]}, 400, "input[1]"),
    ({"model": "syn", "input": [[]]}, 400, "input[0]"),
    ({"model": "syn"}, 400, "input"),
    ({"input": "hi"}, 400, "model"),
    ({"model": "syn", "input": 42}, 400, "'input' must be"),
    ({"model": "syn", "input": [1, "a"]}, 400, "'input' must be"),
    ({"model": "syn", "input": [1.5]}, 400, "'input' must be"),
    ({"model": "syn", "input": {"text": "a"}}, 400, "'input' must be"),
    ({"model": "syn", "input": "a", "encoding_format": "hex"}, 400, "encoding_format"),
    ({"model": "syn", "input": "a", "dimensions": 9}, 400, "dimensions"),
    ({"model": "syn", "input": "w " * 65}, 400, "64"),
    ({"model": "nope", "input": "a"}, 404, "nope"),
    ({"model": 7, "input": "a"}, 400, "model"),
    ({"model": "all-MiniLM-L6-v2", "input": [[999999]]}, 400, "vocabulary"),
    ({"model": "syn", "input": [-1]}, 400, "negative token id"),
    ({"model": "syn", "input": [[3, -2]]}, 400, "negative token id"),
    ({"model": "all-MiniLM-L6-v2", "input": [[101, -5, 102]]}, 400, "negative token id"),
]


@pytest.mark.parametrize(("body", "status", "fragment"), CASES)
def test_bad_body(main_server: Server, body: dict[str, object], status: int, fragment: str) -> None:
    response = httpx.post(f"{main_server.api}/embeddings", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert fragment in error["message"]


def test_not_json(main_server: Server) -> None:
    response = httpx.post(
        f"{main_server.api}/embeddings",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    assert "JSON" in response.json()["error"]["message"]


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity", "0", "-5", "soon"])
def test_bad_timeout_header(main_server: Server, value: str) -> None:
    response = httpx.post(f"{main_server.api}/embeddings", json={"model": "syn", "input": "a"},
                          headers={"x-conveyor-timeout-ms": value})  # fmt: skip
    assert response.status_code == 400, response.text
    assert "x-conveyor-timeout-ms" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "body",
    [
        b"no boundary anywhere",
        b"--b\r\ngarbage\r\n\r\n",
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\ncut off',
    ],
)
def test_malformed_upload(main_server: Server, body: bytes) -> None:
    response = httpx.post(f"{main_server.api}/files", content=body,
                          headers={"content-type": "multipart/form-data; boundary=b"})  # fmt: skip
    assert response.status_code == 400, response.text
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_too_many_inputs(server_factory) -> None:
    server: Server = server_factory(
        {"models": [{"name": "syn", "kind": "synthetic", "batch_latency_ms": 0,
                     "max_inputs_per_request": 3}]}
    )  # fmt: skip
    response = httpx.post(f"{server.api}/embeddings", json={"model": "syn", "input": list("abcd")})
    assert response.status_code == 400
    assert "too many inputs" in response.json()["error"]["message"]


def test_unknown_route_and_method(main_server: Server) -> None:
    assert httpx.get(f"{main_server.api}/nothing-here").status_code == 404
    wrong_method = httpx.get(f"{main_server.api}/embeddings")
    assert wrong_method.status_code == 405
    assert "error" in wrong_method.json()


def test_still_serving_after_abuse(main_server: Server) -> None:
    """The same process answers a good request identically before and after every bad one."""
    api = main_server.api
    good = {"model": "syn", "input": "alive"}
    before = httpx.post(f"{api}/embeddings", json=good)
    assert before.status_code == 200
    for body, status, _ in CASES:
        assert httpx.post(f"{api}/embeddings", json=body).status_code == status
    not_json = {"content-type": "application/json"}
    assert httpx.post(f"{api}/embeddings", content=b"{not", headers=not_json).status_code == 400
    assert httpx.get(f"{api}/embeddings").status_code == 405
    poisoned = httpx.post(f"{api}/embeddings", json={"model": "syn", "input": ["ok", "POISON"]})
    assert poisoned.status_code == 400
    after = httpx.post(f"{api}/embeddings", json=good)
    assert after.status_code == 200
    assert after.json()["data"] == before.json()["data"]
    assert main_server.process.poll() is None
