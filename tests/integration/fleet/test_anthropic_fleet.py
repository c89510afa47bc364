"""Anthropic's APIs across a fleet: ``/v1/messages`` (whole and streamed) and
``count_tokens`` are routed through the gateway to the worker hosting the model, like
chat, and a Message Batch submitted to the gateway runs on the worker's shard runners
from the shared PostgreSQL job store, each request answered once."""

from __future__ import annotations

from pathlib import Path

import anthropic
import pytest
import yaml

from conveyor.fakes.checkpoints import build_tiny_llama
from tests.e2e.test_anthropic_batches import tiny_llama
from tests.integration.fleet.conftest import Fleet, routable_ids
from tests.polling import until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

JOBS = {"lines_per_shard": 4, "poll_every_s": 0.1, "renew_every_s": 0.3, "lease_s": 2}
WAIT_S = 60.0


def test_messages_and_a_message_batch_go_through_the_gateway(fleet: Fleet, tmp_path: Path) -> None:
    objects = ("--objects", str(tmp_path / "objects"))
    model = tiny_llama(build_tiny_llama(tmp_path / "llama"))
    fleet.start_worker("a", config={"models": [model], "jobs": JOBS}, extra_args=objects)
    gateway_config = tmp_path / "gateway.yaml"
    gateway_config.write_text(yaml.safe_dump({"jobs": JOBS}))
    gateway = fleet.start_gateway(extra_args=(*objects, "--config", str(gateway_config)))
    until(lambda: routable_ids(gateway) == {"a"}, "a routable worker", timeout_s=10)
    client = anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Hello"}]
    message = client.messages.create(model="tiny-llama", max_tokens=4, messages=messages)  # type: ignore[arg-type]
    assert message.type == "message" and message.usage.output_tokens <= 4
    with client.messages.stream(model="tiny-llama", max_tokens=4, messages=messages) as stream:  # type: ignore[arg-type]
        assert stream.get_final_message().usage.input_tokens == message.usage.input_tokens
    counted = client.messages.count_tokens(model="tiny-llama", messages=messages)  # type: ignore[arg-type]
    assert counted.input_tokens == message.usage.input_tokens

    requests = [{"custom_id": f"f{i}", "params": {"model": "tiny-llama", "max_tokens": 4,
                                                  "messages": messages}} for i in range(10)]  # fmt: skip
    batch = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    batch = until(
        lambda: b if (b := client.messages.batches.retrieve(batch.id)).processing_status
        == "ended" else None,
        "the message batch to end", timeout_s=WAIT_S, interval_s=0.1,
    )  # fmt: skip
    assert batch.request_counts.succeeded == 10
    found = [result.custom_id for result in client.messages.batches.results(batch.id)]
    assert sorted(found) == sorted(r["custom_id"] for r in requests)
