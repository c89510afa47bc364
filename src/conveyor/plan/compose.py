"""One ``conveyor plan`` run's answer from its inputs: the capacity plan (at a request rate,
or at the rate a population of users makes), the model's distribution, or both.

Pure: a calibration, when there is one, is measured first and handed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from conveyor.plan.calibrate import GenerativeCalibration, OneShotCalibration
from conveyor.plan.distribution import Fleet, distribution_plan
from conveyor.plan.gpus import GpuSpec
from conveyor.plan.planner import GenerativeCosts, plan_generative, plan_one_shot, plan_preset
from conveyor.plan.shape import ModelShape
from conveyor.plan.sizing import Workload
from conveyor.plan.users import Users, plan_for_users

Plan = dict[str, Any]
Measured = OneShotCalibration | GenerativeCalibration


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """Everything ``conveyor plan`` was asked, parsed."""

    prompt_tokens: int | None = None
    output_tokens: int = 0
    qps: float | None = None
    users: Users | None = None
    shape: ModelShape | None = None
    gpu: GpuSpec | None = None
    tensor_parallel_size: int | None = None
    p99_ttft_ms: float | None = None
    tpot_ms: float | None = None
    gpu_hour_usd: float | None = None
    regions: int = 1
    target_utilisation: float = 0.7
    max_wait_ms: float = 5.0
    fleet: Fleet | None = None

    def __post_init__(self) -> None:
        """Refuse inputs that ask for nothing, or for a rate twice."""
        if self.qps is not None and self.users is not None:
            raise ValueError("give --qps or --users with --think-time-s, not both")
        if self.wants_capacity and self.prompt_tokens is None:
            raise ValueError("a capacity plan needs --prompt-tokens")
        if not self.wants_capacity and self.fleet is None:
            raise ValueError("give --qps, or --users with --think-time-s, or --nodes")

    @property
    def wants_capacity(self) -> bool:
        """Whether a load was given (so replicas are planned)."""
        return self.qps is not None or self.users is not None

    def workload(self, qps: float) -> Workload:
        """The load at ``qps`` requests a second."""
        return Workload(
            qps=qps, prompt_tokens=self.prompt_tokens or 1, output_tokens=self.output_tokens,
            p99_ttft_ms=self.p99_ttft_ms, tpot_ms=self.tpot_ms, gpu_hour_usd=self.gpu_hour_usd,
            regions=self.regions, target_utilisation=self.target_utilisation,
        )  # fmt: skip


def make_plan(request: PlanRequest, measured: Measured | None = None) -> Plan:
    """The capacity plan (if a load was given) and the distribution (if a fleet was)."""
    result: Plan = {}
    if request.wants_capacity:
        plan_at = partial(capacity_plan, request, measured)
        if request.users is not None:
            result = plan_for_users(request.users, plan_at)
        else:
            result = plan_at(request.qps or 0.0)
    if request.fleet is not None:
        result["distribution"] = distribution_plan(request.fleet)
    return result


def capacity_plan(request: PlanRequest, measured: Measured | None, qps: float) -> Plan:
    """Replicas, throughput and latency at ``qps``: from a calibration, else a preset."""
    workload = request.workload(qps)
    if isinstance(measured, GenerativeCalibration):
        costs = GenerativeCosts(measured.step, measured.prefill_s, "calibrated",
                                measured.max_batch, measured.overhead_s, measured.tail_s,
                                measured.overlap_s)  # fmt: skip
        return plan_generative(workload, costs, request.shape, request.gpu)
    if isinstance(measured, OneShotCalibration):
        return plan_one_shot(workload, measured.curve, measured.max_batch, request.max_wait_ms)
    if request.shape is None or request.gpu is None:
        raise ValueError("give --model and --gpu, or --calibrate URL")
    return plan_preset(workload, request.shape, request.gpu, request.tensor_parallel_size)
