"""The ``tracing:`` section of the config file (off unless an OTLP endpoint is given)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TracingConfig(BaseModel):
    """Where to send OpenTelemetry traces and how many to keep.

    ``otlp_endpoint`` is an OTLP/HTTP traces URL (``http://collector:4318/v1/traces``);
    unset, no spans are made at all. ``sample_ratio`` samples new traces; a request that
    arrives with a sampled ``traceparent`` is always traced (parent-based sampling).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    otlp_endpoint: str | None = Field(
        default=None, min_length=1, description="OTLP/HTTP traces URL; unset: no spans at all."
    )
    sample_ratio: float = Field(
        default=1.0, ge=0, le=1, description="Share of new traces kept (an incoming sampled "
        "traceparent is always followed).",
    )  # fmt: skip
    service_name: str | None = Field(
        default=None, min_length=1, description="Default: conveyor-serve or conveyor-gateway."
    )
