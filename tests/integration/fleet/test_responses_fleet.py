"""The Responses API through a gateway, with two real workers on a tiny random Llama.

Turns of a conversation after the first carry ``previous_response_id``; the gateway takes
its conversation as the session hint, so every later turn lands on one worker. Stored
responses are read, listed, cancelled and deleted on the gateway itself (the fleet's
store is shared); a background response queued through one worker is run by a worker and
read back through the gateway. The OpenAI Agents SDK's default model runs its two-step
tool loop through the gateway.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Literal

import httpx
import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from pydantic import BaseModel

from conveyor.fakes.checkpoints import build_tiny_llama
from tests.integration.fleet.conftest import Fleet, Proc, routable_ids
from tests.polling import until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

LLAMA = "llama"
NUM_CONVERSATIONS = 3
NUM_TURNS = 4


class Forecast(BaseModel):
    """The agent's final answer: a schema keeps the random model's reply short and whole."""

    is_warm: bool


def worker_config(checkpoint: Path) -> dict[str, Any]:
    model = {
        "name": LLAMA, "kind": "generate", "path": str(checkpoint), "device": "cpu",
        "max_num_seqs": 8, "max_num_batched_tokens": 512, "kv_cache_tokens": 8192,
        "block_size": 4, "max_model_len": 1024, "threads": 1,
    }  # fmt: skip
    return {"models": [model], "jobs": {"poll_every_s": 0.1, "renew_every_s": 0.2}}


def prompt_tokens(worker: Proc) -> float:
    return worker.metric("conveyor_prompt_tokens_total", model=LLAMA)


def turn(client: openai.OpenAI, text: str, previous: str | None) -> str:
    made = client.responses.create(model=LLAMA, input=text, previous_response_id=previous,
                                   max_output_tokens=16, temperature=0)  # fmt: skip
    return made.id


def served_by(workers: list[Proc], before: dict[str, float]) -> str:
    """The one worker whose prompt-token counter moved since ``before``."""
    moved = [w.name for w in workers if prompt_tokens(w) > before[w.name]]
    assert len(moved) == 1, moved
    return moved[0]


def test_responses_through_a_gateway(fleet: Fleet, tmp_path: Path) -> None:
    config = worker_config(build_tiny_llama(tmp_path / "llama"))
    workers = [fleet.spawn_worker(name, config=config) for name in ("a", "b")]
    for worker in workers:
        fleet.wait_ready(worker)
    gateway = fleet.start_gateway()
    until(lambda: routable_ids(gateway) == {"a", "b"}, "both workers routable", timeout_s=10)
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    last_ids = []
    for index in range(NUM_CONVERSATIONS):
        previous, later = None, set()
        for number in range(NUM_TURNS):
            before = {w.name: prompt_tokens(w) for w in workers}
            previous = turn(client, f"Conversation {index}, turn {number}.", previous)
            if number:
                later.add(served_by(workers, before))
        assert len(later) == 1, f"conversation {index}'s later turns went to {later}"
        last_ids.append(previous)
    check_stored_on_the_gateway(client, last_ids[0])
    check_background_through_the_gateway(client)
    check_agents_sdk_through_the_gateway(gateway)


def check_stored_on_the_gateway(client: openai.OpenAI, response_id: str | None) -> None:
    """Read, list, refuse to cancel and delete a stored response on the gateway."""
    assert response_id is not None
    assert client.responses.retrieve(response_id).previous_response_id is not None
    items = list(client.responses.input_items.list(response_id, limit=3))
    assert len(items) == 2 * NUM_TURNS - 1
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(response_id)  # only background responses are
    client.responses.delete(response_id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response_id)


def check_background_through_the_gateway(client: openai.OpenAI) -> None:
    """Queued through a worker, run by a worker, read back through the gateway."""
    queued = client.responses.create(model=LLAMA, input="In the background.", background=True,
                                     max_output_tokens=16, temperature=0)  # fmt: skip
    found = until(
        lambda: r if (r := client.responses.retrieve(queued.id)).status not in
        ("queued", "in_progress") else None,
        "the background response to end",
    )  # fmt: skip
    assert found.status in ("completed", "incomplete") and found.output and found.usage


def check_agents_sdk_through_the_gateway(gateway: Proc) -> None:
    """The Agents SDK's default model runs its two-step tool loop through the gateway."""
    cities: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """Get the current weather in a city."""
        cities.append(city)
        return '{"temperature_c": 17}'

    set_tracing_disabled(True)
    set_default_openai_client(
        openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0),
        use_for_tracing=False,
    )
    # The tiny random model calls the tool only when made to (once: no parallel calls); the
    # SDK then lets it answer, in the schema of its output type.
    settings = ModelSettings(
        tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=200
    )
    agent = Agent(name="weather", model=LLAMA, tools=[get_weather], model_settings=settings,
                  output_type=Forecast)  # fmt: skip
    result = asyncio.run(Runner.run(agent, input="What is the weather in Paris?"))
    assert len(cities) == 1 and len(result.raw_responses) == 2
    assert isinstance(result.final_output, Forecast)
    with httpx.Client() as http:  # both steps were stored in the shared store
        for raw in result.raw_responses:
            assert http.get(f"{gateway.url}/v1/responses/{raw.response_id}").status_code == 200
