"""A simulation scenario as YAML: fleet, time model, traffic, tenants, faults.

Validated once on load (pydantic, unknown keys refused), so a typo is an error with its
path, never a silently ignored setting. ``distribution`` scenarios describe a model pull
onto a fleet of nodes instead of serving traffic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Lengths(_Strict):
    """A token count per request: fixed, or drawn from a distribution around its mean."""

    mean: float = Field(gt=0, description="Mean tokens.")
    dist: Literal["fixed", "exponential", "lognormal"] = Field(
        default="fixed", description="Distribution of the count."
    )
    sigma: float = Field(default=0.5, gt=0, description="Lognormal: sigma of the log.")
    max: int | None = Field(default=None, ge=1, description="Cap on a drawn count.")


class ModelSpec(_Strict):
    """The served model: its kind, and for a GPU preset its shape."""

    name: str = Field(default="model", description="Model name requests ask for.")
    kind: Literal["llm", "one_shot"] = Field(default="llm", description="Generative or not.")
    params_b: float = Field(default=8.0, gt=0, description="Parameters, in billions.")
    layers: int = Field(default=32, ge=1, description="Decoder layers.")
    kv_heads: int = Field(default=8, ge=1, description="Key/value heads.")
    head_dim: int = Field(default=128, ge=1, description="Head dimension.")
    dtype_bytes: float = Field(default=2.0, gt=0, description="Bytes per weight and KV value.")


class TimeModelSpec(_Strict):
    """Where step and batch times come from: a GPU preset or a calibration file."""

    gpu: str | None = Field(default=None, description="A conveyor plan GPU preset (h100...).")
    calibration: str | None = Field(
        default=None, description="A calibration JSON (relative to the scenario file)."
    )
    one_shot_fixed_ms: float = Field(default=5.0, ge=0, description="One-shot t(n) intercept.")
    one_shot_per_item_ms: float = Field(default=0.2, ge=0, description="One-shot t(n) slope.")
    hop_ms: float = Field(default=0.5, ge=0, description="Network latency of one hop.")
    request_overhead_ms: float = Field(
        default=0.0, ge=0, description="A worker's per-request cost beyond the model."
    )


class EngineSpec(_Strict):
    """A generative worker's engine limits (the scheduler's and block manager's)."""

    max_num_seqs: int = Field(default=256, ge=1, description="Running sequences at most.")
    max_num_batched_tokens: int = Field(default=8192, ge=1, description="Tokens a step.")
    max_model_len: int = Field(default=4096, ge=1, description="Longest sequence.")
    block_size: int = Field(default=16, ge=1, description="Tokens per KV block.")
    kv_tokens: int | None = Field(
        default=None, ge=1, description="KV pool; unset: what the GPU holds beside the weights."
    )
    max_queue: int = Field(default=1024, ge=1, description="Requests waiting; beyond: 429.")
    job_tokens_beside_online: int | None = Field(
        default=None, ge=1, description="Batch-job tokens a step while online traffic is present."
    )
    fast_forward: bool = Field(
        default=True,
        description="Time runs of decode-only steps at once (false: every step one by one).",
    )
    decode_model: Literal["exact", "counted"] = Field(
        default="exact",
        description="exact: the real scheduler every step; counted: its rules over token "
        "counts, O(changes) a step, for large fleets (online traffic, no prefix cache).",
    )


class BatchingSpec(_Strict):
    """A one-shot worker's dynamic batcher."""

    max_batch_size: int = Field(default=64, ge=1, description="Inputs a batch at most.")
    max_wait_ms: float = Field(default=5.0, ge=0, description="Wait for a fuller batch.")
    max_queue: int = Field(default=2048, ge=1, description="Inputs waiting per class.")
    mixed_batch_slack_ms: float = Field(default=20.0, ge=0, description="Online slack.")


class RegionSpec(_Strict):
    """A region: its workers and gateways."""

    name: str = Field(min_length=1, description="Region label.")
    workers: int = Field(ge=0, description="Workers in the region.")
    gateways: int = Field(default=1, ge=0, description="Gateways in the region.")


class AffinitySpec(_Strict):
    """Prefix and session affinity in the router (None in the fleet: load alone)."""

    load_bound: int = Field(
        default=4, ge=0, description="How much busier a preferred worker may be."
    )
    use_prefix: bool = Field(default=True, description="Prefer the worker holding the prefix.")
    use_session: bool = Field(default=True, description="Prefer the session's worker.")


class FleetSpec(_Strict):
    """Gateways and workers, and the fleet's timing knobs."""

    regions: list[RegionSpec] = Field(min_length=1, description="Regions of the fleet.")
    model: ModelSpec = Field(default_factory=ModelSpec, description="The served model.")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="LLM engine limits.")
    batching: BatchingSpec = Field(default_factory=BatchingSpec, description="One-shot batcher.")
    affinity: AffinitySpec | None = Field(default=None, description="Affinity routing.")
    cross_region: bool = Field(default=True, description="Gateways route to every region.")
    heartbeat_s: float = Field(default=1.0, gt=0, description="Worker heartbeat period.")
    refresh_s: float = Field(default=1.0, gt=0, description="Gateway registry refresh period.")
    stale_after_s: float = Field(default=5.0, gt=0, description="A row this old is stale.")
    reap_after_s: float = Field(default=30.0, gt=0, description="A row this old is reaped.")
    ejection_cooldown_s: float = Field(default=5.0, ge=0, description="Passive ejection.")
    max_attempts: int = Field(default=3, ge=1, description="Workers tried per request.")
    connect_timeout_s: float = Field(default=1.0, gt=0, description="Unreachable host: give up.")


class RateStep(_Strict):
    """From ``at_s`` on, the traffic's rate is ``rate_rps``."""

    at_s: float = Field(ge=0, description="When the rate changes.")
    rate_rps: float = Field(ge=0, description="The new rate.")


class TrafficSpec(_Strict):
    """One source of requests: open-loop Poisson, chat sessions, or a batch job."""

    kind: Literal["poisson", "chat", "closed", "batch_job"] = Field(
        description="The source's kind (closed: clients sending again as soon as answered)."
    )
    name: str = Field(default="traffic", description="Label in the results.")
    rate_rps: float = Field(default=0.0, ge=0, description="Poisson: requests a second.")
    steps: list[RateStep] = Field(default_factory=list, description="Poisson: rate changes.")
    arrivals: Literal["poisson", "constant"] = Field(
        default="poisson", description="Gaps drawn at random, or a fixed schedule (loadgen's)."
    )
    start_s: float = Field(default=0.0, ge=0, description="When the source starts.")
    stop_s: float | None = Field(default=None, description="When it stops (None: at the end).")
    prompt_tokens: Lengths = Field(
        default_factory=lambda: Lengths(mean=100), description="Prompt tokens a request."
    )
    output_tokens: Lengths = Field(
        default_factory=lambda: Lengths(mean=20), description="Output tokens a request."
    )
    shared_prefix_tokens: int = Field(default=0, ge=0, description="A system prompt all share.")
    tenant: str = Field(default="default", description="The tenant sending.")
    region: str | None = Field(default=None, description="Gateways' region (None: any).")
    timeout_s: float = Field(default=30.0, gt=0, description="A request's deadline.")
    sessions: int = Field(default=0, ge=0, description="Chat: concurrent sessions.")
    turns: int = Field(default=1, ge=1, description="Chat: turns a session.")
    think_s: float = Field(default=1.0, ge=0, description="Chat: mean think time.")
    stagger_s: float | None = Field(
        default=None, ge=0,
        description="Chat: sessions start this far apart (None: each at random within the "
        "first think time).",
    )  # fmt: skip
    lines: int = Field(default=0, ge=0, description="Batch job: lines.")
    shard_lines: int = Field(default=100, ge=1, description="Batch job: lines a shard.")
    lease_s: float = Field(default=30.0, gt=0, description="Batch job: shard lease.")
    renew_every_s: float = Field(default=2.0, gt=0, description="Batch job: lease renewal.")
    lines_in_flight: int = Field(default=64, ge=1, description="Batch job: lines a worker runs.")


class FaultSpec(_Strict):
    """Something going wrong at ``at_s`` (until ``until_s`` where it can end)."""

    kind: Literal[
        "kill_worker", "straggler", "lose_region", "lose_gateway", "stale_heartbeats",
        "store_outage",
    ] = Field(description="What goes wrong.")  # fmt: skip
    at_s: float = Field(ge=0, description="When.")
    until_s: float | None = Field(default=None, description="When it ends (where it can).")
    worker: str | None = Field(default=None, description="Worker id (w0, w1...).")
    region: str | None = Field(default=None, description="Region name.")
    gateway: str | None = Field(default=None, description="Gateway id (g0...).")
    slowdown: float = Field(default=3.0, ge=1, description="Straggler: times slower.")


class TenantSpec(_Strict):
    """A tenant's weight and per-minute limits (unset: unlimited)."""

    name: str = Field(min_length=1, description="Tenant name.")
    weight: float = Field(default=1.0, gt=0, description="Fair-share weight.")
    rpm: int | None = Field(default=None, ge=1, description="Requests a minute.")
    input_tpm: int | None = Field(default=None, ge=1, description="Input tokens a minute.")
    output_tpm: int | None = Field(default=None, ge=1, description="Output tokens a minute.")


class DistributionSpec(_Strict):
    """A model pulled onto ``nodes`` in racks behind uplinks, chunk by chunk."""

    model_bytes: int = Field(ge=1, description="Model size.")
    nodes: int = Field(ge=1, description="Nodes to load onto.")
    rack_size: int = Field(default=32, ge=1, description="Nodes a rack.")
    uplink_gbps: float = Field(default=100.0, gt=0, description="Rack uplink, Gbit/s.")
    origin_gbps: float = Field(default=100.0, gt=0, description="Origin egress, Gbit/s.")
    node_gbps: float = Field(default=100.0, gt=0, description="Node NIC, Gbit/s.")
    chunk_bytes: int = Field(default=64 * 2**20, ge=1, description="Chunk size.")
    max_in_flight: int = Field(default=4, ge=1, description="Fetches a node runs at once.")


class Scenario(_Strict):
    """A whole scenario."""

    name: str = Field(min_length=1, description="Scenario name.")
    description: str = Field(default="", description="What it asks.")
    seed: int = Field(default=0, description="Default seed.")
    duration_s: float = Field(default=60.0, gt=0, description="Simulated seconds of traffic.")
    drain_s: float = Field(default=30.0, ge=0, description="Seconds to finish after it.")
    time_model: TimeModelSpec = Field(default_factory=TimeModelSpec, description="Times.")
    fleet: FleetSpec | None = Field(default=None, description="The serving fleet.")
    traffic: list[TrafficSpec] = Field(default_factory=list, description="Request sources.")
    tenants: list[TenantSpec] = Field(default_factory=list, description="Tenants.")
    faults: list[FaultSpec] = Field(default_factory=list, description="Faults.")
    distribution: DistributionSpec | None = Field(default=None, description="A model pull.")
    base_dir: str = Field(default=".", description="Where relative paths start (set on load).")

    @model_validator(mode="after")
    def _one_kind(self) -> Scenario:
        if (self.fleet is None) == (self.distribution is None):
            raise ValueError("a scenario has either a fleet (with traffic) or a distribution")
        if (
            self.fleet is not None
            and self.time_model.gpu is None
            and not self.time_model.calibration
        ):
            raise ValueError("time_model needs a gpu preset or a calibration file")
        return self


def scaled(scenario: Scenario, factor: float) -> Scenario:
    """The scenario with ``factor`` times the workers, gateways, rates and sessions: a slice
    of a fleet too large to simulate whole, each worker loaded as in the whole."""
    if factor <= 0:
        raise ValueError("the scale must be > 0")
    fleet = scenario.fleet
    if fleet is None:
        pull = scenario.distribution
        if pull is None:
            return scenario
        nodes = max(1, round(pull.nodes * factor))
        return scenario.model_copy(
            update={"distribution": pull.model_copy(update={"nodes": nodes})}
        )
    regions = [r.model_copy(update={"workers": max(1, round(r.workers * factor)),
                                    "gateways": max(1, round(r.gateways * factor))})
               for r in fleet.regions]  # fmt: skip
    traffic = [t.model_copy(update={
        "rate_rps": t.rate_rps * factor, "sessions": round(t.sessions * factor),
        "steps": [s.model_copy(update={"rate_rps": s.rate_rps * factor}) for s in t.steps],
    }) for t in scenario.traffic]  # fmt: skip
    return scenario.model_copy(
        update={"fleet": fleet.model_copy(update={"regions": regions}), "traffic": traffic}
    )


def load_scenario(path: Path) -> Scenario:
    """Read and validate a scenario file."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ValueError(f"{path} does not hold a YAML mapping")
    raw.setdefault("base_dir", str(path.resolve().parent))
    return Scenario.model_validate(raw)


def with_decode_model(scenario: Scenario, model: str) -> Scenario:
    """The scenario with its generative workers' ``engine.decode_model`` set to ``model``
    (ValueError for one that is not a model)."""
    fleet = scenario.fleet
    if fleet is None:
        return scenario
    raw = fleet.engine.model_dump()
    raw["decode_model"] = model
    engine = EngineSpec.model_validate(raw)  # refuses an unknown model
    return scenario.model_copy(update={"fleet": fleet.model_copy(update={"engine": engine})})


def with_workers(scenario: Scenario, workers: int) -> Scenario:
    """The scenario with ``workers`` workers in each region (a sweep over fleet sizes at
    the same traffic); ValueError for fewer than one or a scenario without a fleet."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    fleet = scenario.fleet
    if fleet is None:
        raise ValueError("--workers needs a scenario with a fleet")
    regions = [region.model_copy(update={"workers": workers}) for region in fleet.regions]
    return scenario.model_copy(update={"fleet": fleet.model_copy(update={"regions": regions})})
