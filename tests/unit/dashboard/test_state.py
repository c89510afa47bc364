"""The dashboard's state document and page routes, in-process."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, Histogram

from conveyor.api.app import create_app
from conveyor.api.gateway_app import create_gateway_app
from conveyor.config.settings import ServerConfig
from conveyor.dashboard.held import PlanBoard, has_drifted
from conveyor.dashboard.metrics_read import MetricReader
from conveyor.dashboard.plans import one_shot_plan, preset_for
from conveyor.dashboard.serve_state import generative_model
from conveyor.dashboard.state import job_row, model_pulls, tenant_limits
from conveyor.gateway.process import GatewaySettings
from conveyor.observability.metrics import Metrics
from conveyor.priority import Priority
from conveyor.stores import open_job_store
from conveyor.stores.records import BatchRecord, BatchStatus, RequestCounts
from tests.unit.plan.test_sizing import LLAMA2_7B

pytestmark = pytest.mark.anyio

SYN = {"name": "syn", "kind": "synthetic", "batch_latency_ms": 1, "max_wait_ms": 1, "dim": 4}
KEY = "tenant-a-key-123"


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


def _config(tmp_path: Path, **extra: Any) -> ServerConfig:
    return ServerConfig.model_validate({"models": [SYN], "data_dir": str(tmp_path), **extra})


async def test_the_state_shows_what_the_model_did(tmp_path: Path) -> None:
    app = create_app(_config(tmp_path))
    async with app.router.lifespan_context(app), _client(app) as client:
        for _ in range(4):
            answer = await client.post("/v1/embeddings", json={"model": "syn", "input": ["a", "b"]})
            assert answer.status_code == 200
        # A batch line waits behind online requests: its latency is a series of its own.
        await app.state.service.embed("syn", ["line"], priority=Priority.BATCH)
        await app.state.service.ledger.flush()  # online usage is written every second
        state = (await client.get("/v1/dashboard/state")).json()
    assert state["object"] == "dashboard.state" and state["role"] == "serve"
    assert state["viewer"] == {"tenant": "default", "scope": "all"}
    (model,) = state["models"]
    assert model["name"] == "syn" and model["kind"] == "one-shot"
    assert model["totals"]["inputs"] == 9 and model["totals"]["requests"]["ok"] == 5
    assert model["queue_depth"] == {"online": 0, "batch": 0}
    assert model["config"] == {"max_batch_size": 32, "max_wait_ms": 1.0}
    assert model["histograms"]["latency_s"][-1] == [None, 4]
    assert model["histograms"]["batch_latency_s"][-1] == [None, 1]
    assert model["plan"]["inputs_per_s_per_replica"] > 0
    assert model["plan"]["source"] == "measured batch-time curve"
    assert model["plan"]["predicted_p99_ms"] > 0 and model["plan"]["max_batch"] == 32
    assert state["pulls"] == []
    assert state["tenants"]["limits"] == []
    assert state["jobs"] == [] and state["fleet"] is None
    assert state["tenants"]["available"] is True
    (usage,) = state["tenants"]["usage"]
    assert (usage["tenant"], usage["requests"], usage["input_tokens"]) == ("default", 4, 8)


async def test_the_state_needs_a_key_and_the_page_does_not(tmp_path: Path) -> None:
    app = create_app(_config(tmp_path, api_keys=[{"key": KEY, "tenant": "a"}]))
    async with app.router.lifespan_context(app), _client(app) as client:
        assert (await client.get("/v1/dashboard/state")).status_code == 401
        keyed = await client.get("/v1/dashboard/state", headers={"authorization": f"Bearer {KEY}"})
        page = await client.get("/dashboard")
        script = await client.get("/dashboard/vendor/uPlot.iife.min.js")
        other = await client.get("/dashboard/index.html")
    assert keyed.status_code == 200 and keyed.json()["viewer"] == {"tenant": "a", "scope": "tenant"}
    assert page.status_code == 200 and "uPlot.iife.min.js" in page.text
    assert script.status_code == 200 and script.text.startswith(
        "/*! https://github.com/leeoniya/uPlot"
    )
    assert other.status_code == 404


async def test_the_gateway_state_has_the_fleet(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/jobs.sqlite"
    store = open_job_store(url)
    store.upsert_worker("w1", "http://127.0.0.1:9", ["syn"], 8, {"models": {}}, time.time())
    app = create_gateway_app(GatewaySettings(store_url=url), _config(tmp_path), store=store)
    async with app.router.lifespan_context(app), _client(app) as client:
        state = (await client.get("/v1/dashboard/state")).json()
    assert state["role"] == "gateway"
    assert [w["id"] for w in state["fleet"]["workers"]] == ["w1"]
    assert "syn" in state["fleet"]["models"]


def test_histograms_read_back_with_an_infinite_top() -> None:
    registry = CollectorRegistry()
    histogram = Histogram("x_seconds", "x", ["model"], buckets=(0.1, 1.0), registry=registry)
    histogram.labels("m").observe(0.5)
    assert MetricReader(registry).histogram("x_seconds", "m") == [[0.1, 0], [1.0, 1], [None, 1]]


async def test_a_tenant_that_hits_its_rpm_limit_is_listed_by_limit(tmp_path: Path) -> None:
    tenants = [{"name": "default", "limits": {"syn": {"rpm": 2}}}]
    app = create_app(_config(tmp_path, tenants=tenants))
    async with app.router.lifespan_context(app), _client(app) as client:
        codes = [
            (await client.post("/v1/embeddings", json={"model": "syn", "input": "a"})).status_code
            for _ in range(5)
        ]
        state = (await client.get("/v1/dashboard/state")).json()
    assert codes.count(429) == 3
    (row,) = state["tenants"]["limits"]
    assert row["tenant"] == "default" and row["refused"] == {"rpm": 3} and row["num_refused"] == 3


def test_limits_merge_rate_limits_and_budgets_and_filter_by_tenant() -> None:
    refusals = [("a", "rpm", 2.0), ("a", "output_tpm", 1.0), ("b", "rpm", 0.0)]
    rows = tenant_limits(refusals, {"b": 4}, {"b": (10.0, 12.5), "c": (5.0, None)})
    assert [r["tenant"] for r in rows] == ["b", "a", "c"]
    assert rows[0]["refused"] == {"monthly_budget": 4} and rows[0]["month_cost_usd"] == 12.5
    assert rows[1]["refused"] == {"rpm": 2, "output_tpm": 1} and rows[1]["budget_usd"] is None
    assert rows[2]["num_refused"] == 0 and rows[2]["budget_usd"] == 5.0
    assert [r["tenant"] for r in tenant_limits(refusals, {"b": 4}, {}, only="a")] == ["a"]


def running_batch(**fields: Any) -> BatchRecord:
    return BatchRecord(
        id="batch_1", tenant="t", endpoint="/v1/embeddings", input_file_id="file-1",
        completion_window="24h", created_at=1, status=BatchStatus.IN_PROGRESS, **fields,
    )  # fmt: skip


def test_a_job_row_counts_what_the_batch_object_counts() -> None:
    # A shard lost its lease and reran: the live counts fell, the reported ones hold.
    rec = running_batch(
        request_counts=RequestCounts(1000, 305, 0), peak_counts=RequestCounts(1000, 333, 2)
    )
    row = job_row(rec)
    assert (row["total"], row["completed"], row["failed"]) == (1000, 333, 2)


def test_running_pulls_show_bytes_and_progress() -> None:
    metrics = Metrics()
    gauges = metrics.distribution
    gauges.pull_bytes.labels("m", "total").set(1000)
    gauges.pull_bytes.labels("m", "held").set(250)
    gauges.pull_started.labels("m").set(100.0)
    (pull,) = model_pulls(MetricReader(metrics.registry), now_s=104.0)
    assert pull == {"model": "m", "held_bytes": 250, "total_bytes": 1000, "progress": 0.25,
                    "running_s": 4.0}  # fmt: skip


def test_a_one_shot_plan_comes_from_the_measured_curve() -> None:
    plan = one_shot_plan(0.010, 0.001, 16, 5.0)
    assert plan["source"] == "measured batch-time curve" and plan["plan_kind"] == "calibrated"
    assert plan["batch_ms_at_max"] == 26.0
    assert plan["inputs_per_s_per_replica"] == round(16 / 0.026, 3)
    assert plan["per_replica_qps"] == pytest.approx(0.7 * 16 / 0.026, rel=1e-3)


def test_a_generative_plan_comes_from_the_config_and_the_cpu_preset(tmp_path: Path) -> None:
    checkpoint = tmp_path / "llama"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(LLAMA2_7B.read_text())
    hosted: Any = _FakeHosted(checkpoint)
    metrics = Metrics()
    now = [100.0]
    board = PlanBoard(clock=lambda: now[0])

    def shown() -> dict[str, Any]:
        plan = generative_model(MetricReader(metrics.registry), "tiny", hosted, board)["plan"]
        assert plan is not None
        return plan

    plan = shown()
    assert plan["plan_kind"] == "preset" and plan["source"] == "preset cpu from config.json"
    assert "not measured" in plan["note"] and plan["planned_at"] == 100.0
    assert plan["lengths"] == "assumed" and plan["weight_bytes"] == 6738415616 * 2
    assert plan["tokens_per_s_per_replica"] > 0 and plan["predicted_p99_ms"] > 0
    assert plan["max_batch"] == 1600 // (256 + 128)  # the served KV cache, below max_num_seqs
    children = metrics.for_generator("tiny")
    children.prompt_length.observe(40)
    children.generation_length.observe(10)
    now[0] = 200.0
    served = shown()
    assert (served["prompt_tokens"], served["output_tokens"], served["lengths"]) == (
        40,
        10,
        "served",
    )
    assert served["planned_at"] == 200.0
    # Lengths that move a little leave the plan as it was made: it holds steady.
    children.prompt_length.observe(44)
    children.generation_length.observe(11)
    now[0] = 300.0
    assert shown() == served
    assert preset_for("mps") is None


def test_a_held_plan_is_remade_only_when_an_input_drifts() -> None:
    now = [0.0]
    board = PlanBoard(clock=lambda: now[0])
    made: list[tuple[float, ...]] = []

    def plan(inputs: tuple[float, ...]) -> dict[str, Any] | None:
        def make() -> dict[str, Any]:
            made.append(inputs)
            return {"x": inputs[0]}

        return board.plan("m", inputs, make)

    assert plan((10.0, 1.0)) == {"x": 10.0, "planned_at": 0.0}
    now[0] = 5.0
    assert plan((12.0, 1.2)) == {"x": 10.0, "planned_at": 0.0}  # within 25 %
    assert plan((14.0, 1.0)) == {"x": 14.0, "planned_at": 5.0}  # 10 -> 14: remade
    assert made == [(10.0, 1.0), (14.0, 1.0)]
    assert not has_drifted((0.0, 5.0), (0.0, 5.0)) and has_drifted((0.0,), (1e-3,))


class _FakeHosted:
    """What the plan reads of a hosted generator: its config and its KV cache's size."""

    def __init__(self, path: Path) -> None:
        from conveyor.config.model_config import GenerateModelConfig

        self.config = GenerateModelConfig(
            kind="generate", name="tiny", path=path, device="cpu", max_num_seqs=16
        )
        self.engine = SimpleNamespace(num_kv_blocks=100, config=SimpleNamespace(block_size=16))


def test_a_generative_model_shows_its_kv_tier() -> None:
    metrics = Metrics()
    children = metrics.for_generator("tiny")
    children.kv_tier_hit_blocks["host"].inc(3)
    children.kv_tier_bytes["device_to_host"].inc(4096)
    children.kv_tier_blocks["disk"].set(2)
    tier = generative_model(MetricReader(metrics.registry), "tiny")["kv_tier"]
    assert tier["hit_blocks"] == {"host": 3.0, "disk": 0.0}
    assert tier["bytes"]["device_to_host"] == 4096.0 and tier["bytes"]["host_to_device"] == 0.0
    assert tier["blocks"] == {"host": 0.0, "disk": 2.0}
