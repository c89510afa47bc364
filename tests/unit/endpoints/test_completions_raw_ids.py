"""A large completions body whose prompt of token ids leaves no room in the context is
refused from its bytes, with the 400 the parsed body gets; any other body is parsed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from conveyor.api.app import create_app
from conveyor.config.settings import ServerConfig
from conveyor.endpoints import completions
from conveyor.endpoints.completions import (
    parse_completion_body,
    parse_completion_request,
    prepare_completion,
)
from conveyor.endpoints.generation_schemas import CompletionRequest
from conveyor.errors import ConveyorError, InvalidRequest, ModelNotFound
from conveyor.host.offload import LARGE_INPUT_BYTES
from conveyor.host.service import Service

# `model`: runs a real (tiny) torch model, so mutation runs leave it out.
pytestmark = [pytest.mark.anyio, pytest.mark.model]

MAX_MODEL_LEN = 128
LONG = list(range(1, 20_001))  # 20k ids: 109 KB of JSON, far past the context


@pytest.fixture
async def service(llama_path: Path, tmp_path: Path) -> AsyncIterator[Service]:
    tiny = {"name": "tiny", "kind": "generate", "path": str(llama_path), "block_size": 4,
            "kv_cache_tokens": 1024, "max_model_len": MAX_MODEL_LEN}  # fmt: skip
    config = ServerConfig.model_validate({"data_dir": str(tmp_path), "models": [tiny]})
    async with Service(config) as running:
        yield running


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The bodies that reached the ordinary parse."""
    seen: list[bytes] = []

    def recording(raw: bytes) -> CompletionRequest:
        seen.append(raw)
        return parse_completion_request(raw)

    monkeypatch.setattr(completions, "parse_completion_request", recording)
    return seen


def raw_body(prompt: Any, **fields: Any) -> bytes:
    raw = orjson.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 2, **fields})
    assert len(raw) >= LARGE_INPUT_BYTES
    return raw


def the_400(call: Any) -> tuple[str, str | None, str | None]:
    with pytest.raises(InvalidRequest) as caught:
        call()
    return caught.value.message, caught.value.param, caught.value.code


@pytest.mark.parametrize("prompt", [LONG, [[1, 2, 3], LONG], [[1, 2, 3], [4, 5], LONG, [7] * 200]])
async def test_a_prompt_with_no_room_is_refused_unparsed_with_the_same_400(
    service: Service, parsed: list[bytes], prompt: Any
) -> None:
    raw = raw_body(prompt)
    ordinary = the_400(lambda: prepare_completion(service, parse_completion_request(raw)))
    assert ordinary[2] == "context_length_exceeded"
    assert the_400(lambda: parse_completion_body(service, raw)) == ordinary
    assert parsed == []


async def test_a_large_body_whose_prompts_fit_is_parsed(
    service: Service, parsed: list[bytes]
) -> None:
    raw = raw_body([list(range(1, 31))] * 2000)  # 2,000 prompts of 30 ids: each one fits
    request = parse_completion_body(service, raw)
    assert len(request.prompts()) == 2000 and parsed == [raw]


async def test_a_small_body_is_parsed_without_a_look_at_its_bytes(
    service: Service, parsed: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_counting(raw: bytes, key: str) -> None:
        raise AssertionError("counted a small body")

    monkeypatch.setattr(completions, "count_id_lists", no_counting)
    raw = orjson.dumps({"model": "tiny", "prompt": [1] * (MAX_MODEL_LEN + 1)})
    with pytest.raises(ConveyorError):
        prepare_completion(service, parse_completion_body(service, raw))
    assert parsed == [raw]


async def test_an_unknown_model_is_a_404_before_the_ids_are_parsed(
    service: Service, parsed: list[bytes]
) -> None:
    with pytest.raises(ModelNotFound):
        parse_completion_body(service, raw_body(LONG, model="nowhere"))
    assert parsed == []


async def test_the_http_route_refuses_it_from_the_bytes(
    service: Service, parsed: list[bytes]
) -> None:
    transport = httpx.ASGITransport(app=create_app(service.config, service=service))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        headers = {"content-type": "application/json"}
        response = await client.post("/v1/completions", content=raw_body(LONG), headers=headers)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert "the prompt has 20000" in response.json()["error"]["message"]
    assert parsed == []
