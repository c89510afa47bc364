"""How long simulated work takes: an LLM engine step, a one-shot batch, a network hop.

An LLM step computes some prompt tokens (prefills) and one token for each decoding
sequence, reading the weights once and every scheduled sequence's KV cache:

    step_s = overhead_s + per_seq_s x seqs + max(weights_s + per_kv_token_s x kv_tokens,
                                                 per_token_s x tokens)

the larger of the memory-bound and the compute-bound time (the roofline). From a GPU
preset the terms come from ``conveyor plan``'s own arithmetic (``plan.sizing``: its
bandwidth and FLOP/s efficiencies); from a calibration file they are what a real run
measured (on a CPU the step is compute-bound and ``weights_s`` is 0). A one-shot model's
batch of n takes ``fixed_s + per_item_s x n`` (``plan.curves.LinearCurve``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor.plan.curves import LinearCurve
from conveyor.plan.gpus import GpuSpec
from conveyor.plan.shape import ModelShape
from conveyor.plan.sizing import decode_step_s, kv_budget_bytes, prefill_s


@dataclass(frozen=True, slots=True)
class LlmStepTime:
    """The terms of an engine step's time (see the module docstring)."""

    weights_s: float
    per_kv_token_s: float
    per_token_s: float
    overhead_s: float = 0.0
    per_seq_s: float = 0.0

    def step_s(self, num_tokens: int, num_seqs: int, kv_tokens: int) -> float:
        """Seconds for a step computing ``num_tokens`` over ``num_seqs`` sequences that
        read ``kv_tokens`` cached tokens."""
        memory_s = self.weights_s + self.per_kv_token_s * kv_tokens
        compute_s = self.per_token_s * num_tokens
        return self.overhead_s + self.per_seq_s * num_seqs + max(memory_s, compute_s)

    @classmethod
    def from_preset(cls, shape: ModelShape, gpu: GpuSpec) -> LlmStepTime:
        """The roofline terms of ``shape`` on one ``gpu`` (plan's efficiencies)."""
        bandwidth = gpu.bandwidth_bytes_per_s
        weights_s = decode_step_s(shape.weight_bytes, shape.kv_bytes_per_token, 0, 0, bandwidth)
        per_kv_s = decode_step_s(0, shape.kv_bytes_per_token, 1, 1, bandwidth)
        per_token_s = prefill_s(shape.num_params, 1, gpu.bf16_flops_per_s)
        return cls(weights_s, per_kv_s, per_token_s)


def kv_tokens_on(shape: ModelShape, gpu: GpuSpec) -> int:
    """Tokens of KV cache one GPU holds beside the weights (plan's memory fraction)."""
    return kv_budget_bytes(gpu.memory_bytes, shape.weight_bytes) // shape.kv_bytes_per_token


@dataclass(frozen=True, slots=True)
class Calibration:
    """Measured terms, as a calibration file holds them (either kind may be absent)."""

    llm: LlmStepTime | None = None
    one_shot: LinearCurve | None = None
    hop_s: float | None = None
    # What a request costs beyond the model (HTTP, parsing, the answer), per request.
    request_overhead_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The file's content."""
        out: dict[str, Any] = {"request_overhead_s": self.request_overhead_s}
        if self.llm is not None:
            out["llm"] = {name: getattr(self.llm, name) for name in LlmStepTime.__slots__}
        if self.one_shot is not None:
            out["one_shot"] = {
                "fixed_s": self.one_shot.fixed_s,
                "per_item_s": self.one_shot.per_item_s,
            }
        if self.hop_s is not None:
            out["hop_s"] = self.hop_s
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Calibration:
        """Read the file's content; ValueError for a malformed one."""
        try:
            llm = LlmStepTime(**raw["llm"]) if "llm" in raw else None
            one = raw.get("one_shot")
            curve = LinearCurve(float(one["fixed_s"]), float(one["per_item_s"])) if one else None
        except (TypeError, KeyError) as exc:
            raise ValueError(f"malformed calibration: {exc}") from None
        hop = raw.get("hop_s")
        return cls(llm, curve, None if hop is None else float(hop),
                   float(raw.get("request_overhead_s", 0.0)))  # fmt: skip

    @classmethod
    def load(cls, path: Path) -> Calibration:
        """Read a calibration file (JSON)."""
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ValueError(f"{path} does not hold a JSON object")
        return cls.from_json(raw)
