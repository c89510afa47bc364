"""Every Prometheus metric Conveyor exports, defined in one place.

Each ``Service`` owns a ``Metrics`` with its own registry, so several services
(tests, the library) can live in one process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1,
    0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
SIZE_BUCKETS = tuple(float(2**i) for i in range(13))
TOKEN_BUCKETS = tuple(float(4**i) for i in range(11))
FILL_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)

OUTCOMES = (
    "ok",
    "rejected_queue_full",
    "deadline",
    "client_gone",
    "input_error",
    "model_error",
    "unavailable",
)
CLOSE_REASONS = ("full", "tokens", "wait")


@dataclass(slots=True)
class ModelMetrics:
    """Metric children bound to one model's label (looked up once, cheap to use)."""

    queue_depth_online: Any
    queue_depth_batch: Any
    in_flight: Any
    batch_inputs: Any
    batch_tokens: Any
    batch_fill: Any
    batches_closed: dict[str, Any]
    queue_wait_s: Any
    model_s: Any
    latency_s: Any
    requests: dict[str, Any]
    oom_backoffs: Any
    service_rate: Any
    inputs_processed: Any


class Metrics:
    """All metric families; ``for_model`` returns the children for one model."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        self.queue_depth = Gauge(
            "conveyor_queue_depth", "Inputs waiting in the queue", ["model", "priority"],
            registry=reg,
        )  # fmt: skip
        self.in_flight = Gauge(
            "conveyor_in_flight", "Inputs on the model right now", ["model"], registry=reg
        )
        self.batch_inputs = Histogram(
            "conveyor_batch_size_inputs", "Inputs per batch", ["model"],
            buckets=SIZE_BUCKETS, registry=reg,
        )  # fmt: skip
        self.batch_tokens = Histogram(
            "conveyor_batch_size_tokens", "Padded tokens per batch", ["model"],
            buckets=TOKEN_BUCKETS, registry=reg,
        )  # fmt: skip
        self.batch_fill = Histogram(
            "conveyor_batch_fill_ratio", "Inputs per batch / max_batch_size", ["model"],
            buckets=FILL_BUCKETS, registry=reg,
        )  # fmt: skip
        self.batches_closed = Counter(
            "conveyor_batches_total", "Batches run, by why they closed", ["model", "reason"],
            registry=reg,
        )  # fmt: skip
        self.queue_wait_s = Histogram(
            "conveyor_queue_wait_seconds", "Time an input waited before its batch ran",
            ["model"], buckets=LATENCY_BUCKETS_S, registry=reg,
        )  # fmt: skip
        self.model_s = Histogram(
            "conveyor_model_seconds", "Model time per batch", ["model"],
            buckets=LATENCY_BUCKETS_S, registry=reg,
        )  # fmt: skip
        self.latency_s = Histogram(
            "conveyor_request_latency_seconds", "End-to-end request latency", ["model"],
            buckets=LATENCY_BUCKETS_S, registry=reg,
        )  # fmt: skip
        self.requests = Counter(
            "conveyor_requests_total", "Requests by outcome", ["model", "outcome"],
            registry=reg,
        )  # fmt: skip
        self.oom_backoffs = Counter(
            "conveyor_oom_backoffs_total", "Times a batch was halved after out-of-memory",
            ["model"], registry=reg,
        )  # fmt: skip
        self.service_rate = Gauge(
            "conveyor_service_rate_inputs_per_second",
            "Estimated inputs per second the model sustains at full batches", ["model"],
            registry=reg,
        )  # fmt: skip
        self.inputs_processed = Counter(
            "conveyor_inputs_processed_total", "Inputs the model has run", ["model"],
            registry=reg,
        )  # fmt: skip

    def for_model(self, model: str) -> ModelMetrics:
        """Children bound to ``model``; every outcome and reason is created up front."""
        return ModelMetrics(
            queue_depth_online=self.queue_depth.labels(model, "online"),
            queue_depth_batch=self.queue_depth.labels(model, "batch"),
            in_flight=self.in_flight.labels(model),
            batch_inputs=self.batch_inputs.labels(model),
            batch_tokens=self.batch_tokens.labels(model),
            batch_fill=self.batch_fill.labels(model),
            batches_closed={r: self.batches_closed.labels(model, r) for r in CLOSE_REASONS},
            queue_wait_s=self.queue_wait_s.labels(model),
            model_s=self.model_s.labels(model),
            latency_s=self.latency_s.labels(model),
            requests={o: self.requests.labels(model, o) for o in OUTCOMES},
            oom_backoffs=self.oom_backoffs.labels(model),
            service_rate=self.service_rate.labels(model),
            inputs_processed=self.inputs_processed.labels(model),
        )
