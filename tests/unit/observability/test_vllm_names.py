"""vLLM's metric names on a scrape: the names, labels and values those readers expect."""

from __future__ import annotations

import time

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from conveyor.engine.core.sequence import Sequence, SequenceStatus
from conveyor.engine.engine_metrics import publish_adapters
from conveyor.observability.metrics import Metrics
from conveyor.observability.vllm_names import AdapterActivity

Scrape = dict[str, list[tuple[dict[str, str], float]]]


def scrape(metrics: Metrics) -> Scrape:
    """Every sample by name, as a reader of the text format sees it."""
    found: Scrape = {}
    text = generate_latest(metrics.registry).decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


def by_model(samples: list[tuple[dict[str, str], float]]) -> dict[str, float]:
    for labels, _ in samples:
        assert set(labels) == {"model_name", "engine"} and labels["engine"] == "0", labels
    return {labels["model_name"]: value for labels, value in samples}


def test_a_generative_models_queue_seats_and_kv_cache_under_vllms_names() -> None:
    metrics = Metrics()
    gen = metrics.for_generator("llama")
    gen.running.set(3)
    gen.waiting.set(5)
    gen.kv_usage.set(16, 48, 64)
    found = scrape(metrics)
    assert by_model(found["vllm:num_requests_running"]) == {"llama": 3}
    assert by_model(found["vllm:num_requests_waiting"]) == {"llama": 5}
    assert by_model(found["vllm:kv_cache_usage_perc"]) == {"llama": 0.25}
    assert by_model(found["vllm:gpu_cache_usage_perc"]) == {"llama": 0.25}
    assert "vllm:lora_requests_info" not in found  # no adapters: vLLM has none either
    # Conveyor's own names stay, with the same figures.
    assert found["conveyor_running_sequences"] == [({"model": "llama"}, 3.0)]


def test_a_one_shot_model_reports_its_queued_inputs_and_those_on_the_model() -> None:
    metrics = Metrics()
    emb = metrics.for_model("minilm")
    emb.queue_depth_online.set(4)
    emb.queue_depth_batch.set(60)
    emb.in_flight.set(32)
    found = scrape(metrics)
    assert by_model(found["vllm:num_requests_waiting"]) == {"minilm": 64}
    assert by_model(found["vllm:num_requests_running"]) == {"minilm": 32}
    assert "vllm:kv_cache_usage_perc" not in found  # no KV cache to report


def test_lora_info_names_the_running_and_waiting_adapters_and_the_slots() -> None:
    metrics = Metrics()
    gen = metrics.for_generator("llama")
    gen.adapters = AdapterActivity(4, lambda: {1: "sql", 2: "chat", 3: "math"})
    gen.adapters.publish(running=[1, 3, 0], waiting=[2], now_s=1_700_000_000.0)
    (sample,) = scrape(metrics)["vllm:lora_requests_info"]
    labels, value = sample
    assert labels == {"max_lora": "4", "running_lora_adapters": "math,sql",
                      "waiting_lora_adapters": "chat"}  # fmt: skip
    assert value == 1_700_000_000.0


def test_lora_info_is_one_sample_for_every_base_model_together() -> None:
    metrics = Metrics()
    first, second = metrics.for_generator("a"), metrics.for_generator("b")
    first.adapters = AdapterActivity(2, lambda: {1: "x"})
    second.adapters = AdapterActivity(3, lambda: {1: "y"})
    first.adapters.publish([1], [], now_s=10.0)
    second.adapters.publish([], [1], now_s=20.0)
    ((labels, value),) = scrape(metrics)["vllm:lora_requests_info"]
    assert labels == {"max_lora": "5", "running_lora_adapters": "x",
                      "waiting_lora_adapters": "y"}  # fmt: skip
    assert value == 20.0


def test_an_idle_adapter_model_reports_empty_lists_stamped_now() -> None:
    metrics = Metrics()
    metrics.for_generator("a").adapters = AdapterActivity(8, dict)
    before = time.time()
    ((labels, value),) = scrape(metrics)["vllm:lora_requests_info"]
    assert labels == {"max_lora": "8", "running_lora_adapters": "",
                      "waiting_lora_adapters": ""}  # fmt: skip
    assert value >= before


def test_the_engine_publishes_each_sequences_adapter_by_status() -> None:
    metrics = Metrics().for_generator("a")
    metrics.adapters = AdapterActivity(4, lambda: {1: "sql", 2: "chat"})

    def seq(name: str, adapter_id: int, status: SequenceStatus) -> Sequence:
        made = Sequence(name, [1, 2], adapter_id=adapter_id)
        made.status = status
        return made

    seqs = [seq("r", 1, SequenceStatus.RUNNING), seq("w", 2, SequenceStatus.WAITING),
            seq("base", 0, SequenceStatus.RUNNING)]  # fmt: skip
    publish_adapters(metrics, seqs)
    assert metrics.adapters.snapshot()[:2] == (["sql"], ["chat"])
    publish_adapters(metrics, [])
    assert metrics.adapters.snapshot()[:2] == ([], [])
