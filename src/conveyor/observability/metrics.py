"""Every Prometheus metric Conveyor exports, defined in one place.

Each ``Service`` owns a ``Metrics`` with its own registry, so several services
(tests, the library) can live in one process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from conveyor.observability.kv_tier_metrics import KVTierFamilies
from conveyor.observability.kv_usage_metrics import KVUsageFamilies
from conveyor.observability.usage_metrics import UsageMetrics
from conveyor.observability.vllm_names import AdapterActivity, VllmNames
from conveyor.priority import Priority

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
# The ``requests_total`` outcome of an error, by its HTTP status (any other: model_error).
OUTCOME_BY_STATUS = {
    400: "input_error",
    429: "rejected_queue_full",
    499: "client_gone",
    503: "unavailable",
    504: "deadline",
}


def outcome_of(status_code: int) -> str:
    """The ``requests_total`` outcome label of an error answered with ``status_code``."""
    return OUTCOME_BY_STATUS.get(status_code, "model_error")


CLOSE_REASONS = ("full", "tokens", "wait")
# Why a generation request ended: OpenAI's finish reasons, a caller's abort, an engine error.
# "shed": refused while waiting (429), its seat predicted to come after its deadline.
FINISH_REASONS = ("stop", "length", "abort", "error", "shed")
# Where an engine step's time goes (see llm_engine.LLMEngine._step).
STEP_PHASES = ("schedule", "prepare", "forward", "sample", "postprocess")
LENGTH_BUCKETS = tuple(float(2**i) for i in range(18))  # 1 .. 131072 tokens


def by_priority(family: Any, model: str) -> dict[Priority, Any]:
    """One child per priority class (label ``online`` or ``batch``) of a family of ``model``."""
    return {p: family.labels(model, p.name.lower()) for p in Priority}


def add_http_and_process_families(reg: CollectorRegistry) -> Counter:
    """Process metrics (CPU, memory, open files) and the HTTP request counter of an app."""
    ProcessCollector(registry=reg)
    return Counter(
        "conveyor_http_requests_total",
        "HTTP requests by route template and status (refusals before any handler included)",
        ["method", "route", "status"], registry=reg,
    )  # fmt: skip


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
    latency_s: dict[Priority, Any]
    requests: dict[str, Any]
    oom_backoffs: Any
    service_rate: Any
    inputs_processed: Any


@dataclass(slots=True)
class GeneratorMetrics:
    """Metric children bound to one generative model's label."""

    running: Any
    waiting: Any
    # Blocks used, blocks free and the used share, set together (``KVUsage.set``).
    kv_usage: Any
    prompt_tokens: Any
    generated_tokens: Any
    time_to_first_token_s: dict[Priority, Any]
    time_per_output_token_s: dict[Priority, Any]
    preemptions: Any
    prefix_cache_hit_tokens: Any
    oom_backoffs: Any
    latency_s: dict[Priority, Any]
    requests: dict[str, Any]
    prefix_cache_query_tokens: Any
    finished: dict[str, Any]
    prompt_length: Any
    generation_length: Any
    queue_time_s: Any
    step_phase_s: dict[str, Any]
    kv_tier_hit_blocks: dict[str, Any]
    kv_tier_bytes: dict[str, Any]
    kv_tier_blocks: dict[str, Any]
    # The LoRA adapters running and waiting (set by the loader when the model serves some).
    adapters: AdapterActivity | None = None
    # True on engine: vllm, whose own metrics carry vLLM's names for this model.
    reports_vllm_names: bool = False


class DistributionMetrics:
    """Model distribution: bytes fetched by source, chunks served to peers, pulls."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.fetch_bytes = Counter(
            "conveyor_model_fetch_bytes", "Model chunk bytes fetched, by source (origin|peer)",
            ["source"], registry=registry,
        )  # fmt: skip
        self.corrupt_chunks = Counter(
            "conveyor_model_corrupt_chunks", "Chunks refused for a wrong size or SHA-256",
            ["source"], registry=registry,
        )  # fmt: skip
        self.chunks_served = Counter(
            "conveyor_model_chunks_served", "Verified chunks served to peers", registry=registry
        )
        self.pull_s = Histogram(
            "conveyor_model_pull_seconds", "Time to pull and assemble a model", ["model"],
            buckets=(*LATENCY_BUCKETS_S, 120.0, 300.0, 600.0, 1800.0), registry=registry,
        )  # fmt: skip
        self.pulls_in_progress = Gauge(
            "conveyor_model_pulls_in_progress", "Model pulls running now", registry=registry
        )
        # One child per pull running now (removed when it ends): bytes held and needed.
        self.pull_bytes = Gauge(
            "conveyor_model_pull_bytes", "Bytes of a running pull, by state (held|total)",
            ["model", "state"], registry=registry,
        )  # fmt: skip
        self.pull_started = Gauge(
            "conveyor_model_pull_started_seconds", "Unix time a running pull started",
            ["model"], registry=registry,
        )  # fmt: skip


class Metrics:
    """All metric families; ``for_model`` returns the children for one model."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        self.distribution = DistributionMetrics(reg)
        self._add_batching_families(reg)
        self._add_job_families(reg)
        self._add_generator_families(reg)
        self._add_generation_request_families(reg)
        self.http_requests = add_http_and_process_families(reg)
        self.usage = UsageMetrics(reg)
        self.generators: dict[str, GeneratorMetrics] = {}
        reg.register(VllmNames(self))

    def _add_batching_families(self, reg: CollectorRegistry) -> None:
        """Families of one-shot models (dynamic batching), labelled by model."""
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
            "conveyor_request_latency_seconds", "End-to-end request latency (batch lines too)",
            ["model", "priority"], buckets=LATENCY_BUCKETS_S, registry=reg,
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

    def _add_job_families(self, reg: CollectorRegistry) -> None:
        """Families of batch jobs (lines, the result cache, storage failures)."""
        self.batch_cache_hits = Counter(
            "conveyor_batch_cache_hits_total", "Batch job lines answered from the result cache",
            registry=reg,
        )  # fmt: skip
        self.batch_lines = Counter(
            "conveyor_batch_lines_total", "Batch job lines run to a result, by outcome",
            ["outcome"], registry=reg,
        )  # fmt: skip
        self.store_errors = Counter(
            "conveyor_store_errors_total",
            "Job store and object store operations of batch jobs that failed, retried later",
            ["store", "operation"], registry=reg,
        )  # fmt: skip
        self.batches_stalled = Gauge(
            "conveyor_batches_stalled",
            "Batches this process cannot move because a store fails (disk_full or unavailable)",
            ["store", "reason"], registry=reg,
        )  # fmt: skip

    def _add_generator_families(self, reg: CollectorRegistry) -> None:
        """Families of generative models (continuous batching), labelled by model."""
        self.running_seqs = Gauge(
            "conveyor_running_sequences", "Sequences holding KV-cache blocks", ["model"],
            registry=reg,
        )  # fmt: skip
        self.waiting_seqs = Gauge(
            "conveyor_waiting_sequences", "Sequences waiting for admission (preempted included)",
            ["model"], registry=reg,
        )  # fmt: skip
        self.kv_usage = KVUsageFamilies(reg)
        self.prompt_tokens = Counter(
            "conveyor_prompt_tokens_total", "Prompt tokens of admitted requests", ["model"],
            registry=reg,
        )  # fmt: skip
        self.generated_tokens = Counter(
            "conveyor_generated_tokens_total", "Tokens sampled", ["model"], registry=reg
        )
        self.time_to_first_token_s = Histogram(
            "conveyor_time_to_first_token_seconds", "Arrival to first sampled token",
            ["model", "priority"], buckets=LATENCY_BUCKETS_S, registry=reg,
        )  # fmt: skip
        self.time_per_output_token_s = Histogram(
            "conveyor_time_per_output_token_seconds", "Time between a request's tokens",
            ["model", "priority"], buckets=LATENCY_BUCKETS_S, registry=reg,
        )  # fmt: skip
        self.preemptions = Counter(
            "conveyor_preemptions_total", "Sequences evicted to free KV-cache blocks",
            ["model"], registry=reg,
        )  # fmt: skip
        self.prefix_cache_hit_tokens = Counter(
            "conveyor_prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache",
            ["model"], registry=reg,
        )  # fmt: skip
        self.step_phase_s = Counter(
            "conveyor_engine_step_seconds_total",
            "Engine-thread seconds in each phase of a step (schedule, prepare, forward, "
            "sample, postprocess)", ["model", "phase"], registry=reg,
        )  # fmt: skip
        self.kv_tier = KVTierFamilies(reg)

    def _add_generation_request_families(self, reg: CollectorRegistry) -> None:
        """Per-request families of generative models, as vLLM's (mapped in the docs)."""
        self.prefix_cache_query_tokens = Counter(
            "conveyor_prefix_cache_query_tokens_total",
            "Tokens looked up in the prefix cache at admission (hits: "
            "conveyor_prefix_cache_hit_tokens_total)", ["model"], registry=reg,
        )  # fmt: skip
        self.finished = Counter(
            "conveyor_generation_requests_finished_total", "Generation requests by finish reason",
            ["model", "finish_reason"], registry=reg,
        )  # fmt: skip
        self.prompt_length = Histogram(
            "conveyor_request_prompt_tokens", "Prompt tokens per finished request", ["model"],
            buckets=LENGTH_BUCKETS, registry=reg,
        )  # fmt: skip
        self.generation_length = Histogram(
            "conveyor_request_generation_tokens", "Generated tokens per finished request",
            ["model"], buckets=LENGTH_BUCKETS, registry=reg,
        )  # fmt: skip
        self.queue_time_s = Histogram(
            "conveyor_request_queue_time_seconds", "Arrival to first admission (KV blocks given)",
            ["model"], buckets=LATENCY_BUCKETS_S, registry=reg,
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
            latency_s=by_priority(self.latency_s, model),
            requests={o: self.requests.labels(model, o) for o in OUTCOMES},
            oom_backoffs=self.oom_backoffs.labels(model),
            service_rate=self.service_rate.labels(model),
            inputs_processed=self.inputs_processed.labels(model),
        )

    def for_generator(self, model: str) -> GeneratorMetrics:
        """Children bound to generative ``model`` (kept in ``generators``); every outcome is
        created up front."""
        children = GeneratorMetrics(
            running=self.running_seqs.labels(model),
            waiting=self.waiting_seqs.labels(model),
            kv_usage=self.kv_usage.labels(model),
            prompt_tokens=self.prompt_tokens.labels(model),
            generated_tokens=self.generated_tokens.labels(model),
            time_to_first_token_s=by_priority(self.time_to_first_token_s, model),
            time_per_output_token_s=by_priority(self.time_per_output_token_s, model),
            preemptions=self.preemptions.labels(model),
            prefix_cache_hit_tokens=self.prefix_cache_hit_tokens.labels(model),
            oom_backoffs=self.oom_backoffs.labels(model),
            latency_s=by_priority(self.latency_s, model),
            requests={o: self.requests.labels(model, o) for o in OUTCOMES},
            prefix_cache_query_tokens=self.prefix_cache_query_tokens.labels(model),
            finished={r: self.finished.labels(model, r) for r in FINISH_REASONS},
            prompt_length=self.prompt_length.labels(model),
            generation_length=self.generation_length.labels(model),
            queue_time_s=self.queue_time_s.labels(model),
            step_phase_s={p: self.step_phase_s.labels(model, p) for p in STEP_PHASES},
            **self.kv_tier.children(model),
        )
        self.generators[model] = children
        return children


class GatewayMetrics:
    """A gateway's metrics: its own requests and the fleet-wide scaling signal per model."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        self.fleet_queue_depth = Gauge(
            "conveyor_fleet_queue_depth", "Inputs queued across healthy workers", ["model"],
            registry=reg,
        )  # fmt: skip
        self.arrival_rate = Gauge(
            "conveyor_fleet_arrival_rate_inputs_per_second",
            "Inputs per second arriving at this gateway", ["model"], registry=reg,
        )  # fmt: skip
        self.service_rate = Gauge(
            "conveyor_fleet_service_rate_inputs_per_second",
            "Inputs per second the healthy workers sustain together at full batches", ["model"],
            registry=reg,
        )  # fmt: skip
        self.desired_replicas = Gauge(
            "conveyor_desired_replicas",
            "Workers needed: arrival rate x mean service time / target utilisation", ["model"],
            registry=reg,
        )  # fmt: skip
        self.workers = Gauge(
            "conveyor_fleet_workers",
            "Registered workers hosting the model, by routing state (a worker counts once "
            "per model it hosts)", ["model", "state"], registry=reg,
        )  # fmt: skip
        self.requests = Counter(
            "conveyor_gateway_requests_total", "Proxied requests by final status code",
            ["model", "code"], registry=reg,
        )  # fmt: skip
        self.retries = Counter(
            "conveyor_gateway_retries_total", "Attempts retried on another worker",
            ["model", "reason"], registry=reg,
        )  # fmt: skip
        self.latency_s = Histogram(
            "conveyor_gateway_request_latency_seconds", "Gateway request latency", ["model"],
            buckets=LATENCY_BUCKETS_S, registry=reg,
        )  # fmt: skip
        self.http_requests = add_http_and_process_families(reg)


class TenantMetrics:
    """Tenant families: rate-limit refusals and rate-limit backend errors."""

    def __init__(self, registry: CollectorRegistry) -> None:
        reg = registry
        self.rate_limited = Counter(
            "conveyor_rate_limited_total",
            "Requests refused (429) by a tenant rate limit, by limit (rpm|input_tpm|output_tpm); "
            "monthly budget refusals are conveyor_budget_refusals_total",
            ["tenant", "model", "limit"], registry=reg,
        )  # fmt: skip
        self.backend_errors = Counter(
            "conveyor_rate_limit_backend_errors_total",
            "Rate-limit calls that could not reach the backend (allowed or denied by policy)",
            ["operation"], registry=reg,
        )  # fmt: skip
