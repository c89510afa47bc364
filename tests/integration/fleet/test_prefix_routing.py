"""Prefix-aware routing with real worker processes: a follow-up turn lands where its prefix is.

Three workers serve a tiny random Llama; the gateway hashes chat prompts with the same
tokenizer. Each conversation's first turn goes wherever load sends it; its second turn
(the first turn plus a reply and a new question) must go to that worker and hit its prefix
cache. By load alone each second turn would find its worker one time in three.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from conveyor.fakes.checkpoints import build_tiny_llama
from tests.integration.fleet.conftest import Fleet, Proc, fleet_doc, routable_ids
from tests.polling import until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

LLAMA = "llama"
NUM_CONVERSATIONS = 6


def generate_config(checkpoint: Path) -> dict[str, Any]:
    model = {
        "name": LLAMA, "kind": "generate", "path": str(checkpoint), "device": "cpu",
        "max_num_seqs": 8, "max_num_batched_tokens": 512, "kv_cache_tokens": 8192,
        "block_size": 4, "max_model_len": 512, "threads": 1,
    }  # fmt: skip
    return {"models": [model]}


def chat(client: httpx.Client, gateway: Proc, messages: list[dict[str, str]]) -> str:
    response = client.post(
        f"{gateway.url}/v1/chat/completions",
        json={"model": LLAMA, "messages": messages, "max_tokens": 4, "temperature": 0},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    content: str = response.json()["choices"][0]["message"]["content"]
    return content


def served_by(workers: list[Proc], before: dict[str, float]) -> str:
    """The one worker whose prompt-token counter moved since ``before``."""
    moved = [w.name for w in workers if prompt_tokens(w) > before[w.name]]
    assert len(moved) == 1, moved
    return moved[0]


def prompt_tokens(worker: Proc) -> float:
    return worker.metric("conveyor_prompt_tokens_total", model=LLAMA)


def cache_hits(worker: Proc) -> float:
    return worker.metric("conveyor_prefix_cache_hit_tokens_total", model=LLAMA)


def test_a_follow_up_turn_goes_to_the_worker_holding_its_prefix(
    fleet: Fleet, tmp_path: Path
) -> None:
    checkpoint = build_tiny_llama(tmp_path / "llama")
    config = generate_config(checkpoint)
    # Every process loads at once (start-up is mostly imports); the test starts once all answer.
    workers = [fleet.spawn_worker(name, config=config) for name in ("a", "b", "c")]
    gateway = fleet.spawn_gateway(extra_args=("--prefix-tokenizer", f"{LLAMA}={checkpoint}"))
    for proc in (*workers, gateway):
        fleet.wait_ready(proc)
    # Routable once the gateway has read each worker's fresh heartbeat: under a full suite on
    # two cores that took over 10 s once after all three answered /ready.
    until(lambda: routable_ids(gateway) == {"a", "b", "c"}, "three workers routable", timeout_s=30)
    conversations = [
        [{"role": "system", "content": f"You are assistant number {i}. Be brief."},
         {"role": "user", "content": f"Conversation {i}: tell me about paged attention."}]
        for i in range(NUM_CONVERSATIONS)
    ]  # fmt: skip
    with httpx.Client() as client:
        first_worker = []
        for messages in conversations:
            before = {w.name: prompt_tokens(w) for w in workers}
            messages.append({"role": "assistant", "content": chat(client, gateway, messages)})
            messages.append({"role": "user", "content": "Go on, and say more about blocks."})
            first_worker.append(served_by(workers, before))

        def digests_arrived() -> bool:
            held = {
                w["id"]: w["prefix_blocks"].get(LLAMA, 0) for w in fleet_doc(gateway)["workers"]
            }
            return all(held[name] > 0 for name in set(first_worker))

        until(digests_arrived, "prefix digests in the workers' heartbeats", timeout_s=10)
        for messages, expected in zip(conversations, first_worker, strict=True):
            before = {w.name: prompt_tokens(w) for w in workers}
            hits_before = {w.name: cache_hits(w) for w in workers}
            chat(client, gateway, messages)
            assert served_by(workers, before) == expected
            worker = next(w for w in workers if w.name == expected)
            assert cache_hits(worker) - hits_before[expected] >= 16
    assert fleet_doc(gateway)["routed_by"].get("prefix", 0) >= NUM_CONVERSATIONS
