"""vLLM's metric names beside Conveyor's, for the systems that read vLLM's.

The Kubernetes Gateway API Inference Extension's model-server protocol (llm-d's endpoint
picker) and common KEDA / HPA setups scrape these from every model server:

- ``vllm:num_requests_waiting{model_name,engine}``: requests waiting to be processed
  (a generative model's waiting sequences, preempted ones included; a one-shot model's
  queued inputs, online and batch);
- ``vllm:num_requests_running{model_name,engine}``: requests in model execution batches
  (running sequences; a one-shot model's inputs on the model now);
- ``vllm:kv_cache_usage_perc{model_name,engine}`` and the older
  ``vllm:gpu_cache_usage_perc``: the share of KV-cache blocks held, 1 meaning 100 %
  (generative models only: one-shot models have no KV cache);
- ``vllm:lora_requests_info{max_lora,running_lora_adapters,waiting_lora_adapters}``: the
  adapters of the running and the waiting requests (comma-separated names), the adapter
  slots of a step, and as its value the Unix time those were last published. As vLLM's,
  it has no model label: a process with several base models serving adapters reports
  one sample, every model's adapters together and their slots summed.

``engine`` is always ``"0"`` (vLLM numbers its engine cores; Conveyor has one engine per
model). The values are read from Conveyor's own families when scraped, so the two names
of a figure never disagree.

A model on ``engine: vllm`` reports vLLM's own metrics instead (every ``vllm:`` family of
the process's default registry, where vLLM registers them), merged into these families
so each name appears once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from conveyor.observability.metrics import Metrics

ENGINE = "0"
LABELS = ["model_name", "engine"]
LORA_LABELS = ["max_lora", "waiting_lora_adapters", "running_lora_adapters"]
HELP = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:gpu_cache_usage_perc": "GPU KV-cache usage. 1 means 100 percent usage. "
    "DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
    "vllm:lora_requests_info": "Running stats on lora requests.",
}


@dataclass(slots=True)
class AdapterActivity:
    """Which LoRA adapters a generative model's requests run and wait with.

    The engine thread publishes adapter ids after each step; a scrape reads them as names
    (``names()`` maps the ids of the adapters registered now to their names).
    """

    max_lora: int
    names: Callable[[], Mapping[int, str]]
    running: frozenset[int] = frozenset()
    waiting: frozenset[int] = frozenset()
    updated_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(self, running: Iterable[int], waiting: Iterable[int], now_s: float) -> None:
        """The adapter ids of the running and the waiting sequences now (0: none)."""
        run, wait = frozenset(running) - {0}, frozenset(waiting) - {0}
        with self._lock:
            self.running, self.waiting, self.updated_s = run, wait, now_s

    def snapshot(self) -> tuple[list[str], list[str], float]:
        """Running and waiting adapter names (sorted), and when they were published."""
        with self._lock:
            running, waiting, updated_s = self.running, self.waiting, self.updated_s
        names = self.names()
        return _named(running, names), _named(waiting, names), updated_s


def _named(ids: frozenset[int], names: Mapping[int, str]) -> list[str]:
    return sorted(names.get(i, f"adapter-{i}") for i in ids)


def samples_by_model(family: Any) -> dict[str, float]:
    """A model-labelled gauge family's values, summed over its other labels."""
    values: dict[str, float] = {}
    for metric in family.collect():
        for sample in metric.samples:
            model = sample.labels["model"]
            values[model] = values.get(model, 0.0) + sample.value
    return values


class VllmNames(Collector):
    """A collector that reports Conveyor's figures under vLLM's names when scraped."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Any]:
        """Nothing up front: the registry then never collects this to learn its names."""
        return []

    def collect(self) -> Iterator[Any]:
        """The vLLM families, one sample per model (the LoRA one per process), vLLM's own
        samples for the models on its engine, then vLLM's other families."""
        metrics = self._metrics
        on_vllm = {name for name, g in metrics.generators.items() if g.reports_vllm_names}
        own = vllm_own_families() if on_vllm else {}
        running = samples_by_model(metrics.in_flight)
        waiting = samples_by_model(metrics.queue_depth)
        running.update(samples_by_model(metrics.running_seqs))
        waiting.update(samples_by_model(metrics.waiting_seqs))
        kv = {model: s.ratio for model, s in metrics.kv_usage.snapshots().items()}
        for name, values in (("vllm:num_requests_running", running),
                             ("vllm:num_requests_waiting", waiting),
                             ("vllm:kv_cache_usage_perc", kv),
                             ("vllm:gpu_cache_usage_perc", kv)):  # fmt: skip
            family = GaugeMetricFamily(name, HELP[name], labels=LABELS)
            for model, value in sorted(values.items()):
                if model not in on_vllm:
                    family.add_metric([model, ENGINE], value)
            vllm_family = own.pop(name, None)
            if vllm_family is not None:
                family.samples.extend(vllm_family.samples)
            yield family
        activities = [g.adapters for g in metrics.generators.values() if g.adapters is not None]
        if activities and "vllm:lora_requests_info" not in own:
            yield lora_family(activities)
        yield from own.values()


def vllm_own_families() -> dict[str, Any]:
    """vLLM's own metric families, by name: those it registered in this process."""
    from prometheus_client import REGISTRY

    return {family.name: family for family in REGISTRY.collect() if family.name.startswith("vllm:")}


def lora_family(activities: list[AdapterActivity]) -> GaugeMetricFamily:
    """``vllm:lora_requests_info``: every model's adapters in one sample."""
    running: set[str] = set()
    waiting: set[str] = set()
    updated_s = 0.0
    for activity in activities:
        run, wait, at_s = activity.snapshot()
        running.update(run)
        waiting.update(wait)
        updated_s = max(updated_s, at_s)
    family = GaugeMetricFamily(
        "vllm:lora_requests_info", HELP["vllm:lora_requests_info"], labels=LORA_LABELS
    )
    max_lora = sum(a.max_lora for a in activities)
    labels = [str(max_lora), ",".join(sorted(waiting)), ",".join(sorted(running))]
    family.add_metric(labels, updated_s or time.time())
    return family
