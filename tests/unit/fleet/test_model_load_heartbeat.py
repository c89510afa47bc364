"""A worker's heartbeat counts a generative model's sequences as its load.

Before, an LLM model's entry said ``queue_depth: 0`` whatever its engine held, so a
gateway's router saw only its own in-flight count for LLM workers and spread load from
several gateways blind.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, cast

from conveyor.cli.worker import DrainGate, service_load
from conveyor.fleet.registry import model_loads, view_from_record
from conveyor.fleet.router import Ejections, Router
from conveyor.host.service import Service
from conveyor.stores.records import WorkerRecord


@dataclass
class _Digest:
    hashes: tuple[bytes, ...] = ()


@dataclass
class _EngineConfig:
    block_size: int = 16


@dataclass
class _Engine:
    num_waiting: int
    num_running: int
    num_batch: int = 0
    config: _EngineConfig = field(default_factory=_EngineConfig)
    prefix_digest: _Digest = field(default_factory=_Digest)


@dataclass
class _Generator:
    engine: _Engine
    adapters: tuple[str, ...] = ()

    def adapter_names(self) -> tuple[str, ...]:
        return self.adapters


@dataclass
class _Service:
    generators: dict[str, _Generator]

    def models(self) -> list[Any]:
        return []

    def unloaded_models(self) -> list[Any]:
        return []


async def _app(scope: Any, receive: Any, send: Any) -> None:  # never called
    raise AssertionError


def _report(waiting: int, running: int, batch: int = 0) -> dict[str, Any]:
    generator = _Generator(_Engine(waiting, running, batch), adapters=("tuned",))
    service = cast(Service, _Service({"llama": generator}))
    return service_load(service, DrainGate(_app))


def test_generative_model_reports_waiting_plus_running() -> None:
    models = _report(waiting=3, running=5)["models"]
    assert models["llama"]["queue_depth"] == 8
    assert models["llama"]["running"] == 5
    assert models["llama"]["prefix"]["block_size"] == 16
    assert models["tuned"]["queue_depth"] == 8  # an adapter runs on its base's engine
    assert "prefix" not in models["tuned"]
    assert _report(waiting=0, running=0)["models"]["llama"]["queue_depth"] == 0


def test_router_weighs_a_busy_llm_worker_by_its_heartbeat() -> None:
    def record(worker_id: str, waiting: int, running: int) -> WorkerRecord:
        return WorkerRecord(worker_id, f"http://{worker_id}", ("llama", "tuned"), 1,
                            _report(waiting, running), 0.0, 0.0, False)  # fmt: skip

    busy = view_from_record(record("busy", 4, 6))
    idle = view_from_record(record("idle", 0, 0))
    router = Router(random.Random(1), Ejections(5.0))
    assert router.load(busy, "llama") == 10
    assert router.load(idle, "llama") == 0
    picks = [router.choose([busy, idle], "llama", now=0.0) for _ in range(20)]
    assert {pick.worker_id for pick in picks if pick is not None} == {"idle"}


def test_job_lines_count_for_scaling_but_not_in_the_online_routers_load() -> None:
    """A worker full of batch-job lines is not busy for an online request (it goes first):
    before, its depth counted them and online requests went to the worker with fewer
    lines rather than the one with fewer online requests (billion-prompts: online p99
    766 ms beside the job)."""

    def record(worker_id: str, waiting: int, running: int, batch: int) -> WorkerRecord:
        return WorkerRecord(worker_id, f"http://{worker_id}", ("llama",), 1,
                            _report(waiting, running, batch), 0.0, 0.0, False)  # fmt: skip

    lines = record("lines", 40, 60, batch=98)  # 2 online requests beside 98 job lines
    online = record("online", 0, 6, batch=0)  # 6 online requests
    assert model_loads(lines)["llama"].queue_depth == 100  # the scaling signal: both
    assert model_loads(lines)["llama"].batch_depth == 98
    router = Router(random.Random(1), Ejections(5.0))
    views = [view_from_record(lines), view_from_record(online)]
    assert [router.load(view, "llama") for view in views] == [2, 6]
    picks = [router.choose(views, "llama", now=0.0) for _ in range(20)]
    assert {pick.worker_id for pick in picks if pick is not None} == {"lines"}
