"""Settings of the batch-jobs subsystem: the `jobs` section of the server config.

Kept free of other Conveyor imports so `conveyor.config.settings` can embed it without a cycle.
"""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

MIB = 1024 * 1024
DEFAULT_MAX_FILE_BYTES = 200 * MIB
# OpenAI's limit on requests in one batch input file, and Anthropic's in one Message Batch.
DEFAULT_MAX_REQUESTS_PER_BATCH = 50_000
DEFAULT_MAX_REQUESTS_PER_MESSAGE_BATCH = 100_000
HOUR_S = 3600.0
DAY_S = 24 * HOUR_S


class JobsConfig(BaseModel):
    """Files and Batches API: where job state lives and how shards are run.

    Store URLs default to places under the server's `data_dir`: `sqlite://<data_dir>/jobs.sqlite3`
    and `<data_dir>/objects`. Set `job_store_url: postgresql://...` or
    `object_store_url: s3://bucket/prefix` to share jobs between processes or hosts;
    `region_object_store_urls` keeps the files of tenants pinned to regions in their region.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_store_url: str | None = Field(
        default=None, description="sqlite://PATH or postgresql://...; default under data_dir."
    )
    object_store_url: str | None = Field(
        default=None, description="A directory, file:///DIR or s3://bucket/prefix."
    )
    region_object_store_urls: dict[str, str] = Field(
        default_factory=dict,
        description="Object store URL by region: a tenant pinned to regions keeps its batch "
        "files in its first region's store (none there: a start-up error).",
    )
    job_store_connect_timeout_s: int = Field(
        default=3, ge=2, description="PostgreSQL: longest wait to open a connection."
    )
    job_store_statement_timeout_ms: int = Field(
        default=3_000, ge=1,
        description="PostgreSQL: longest statement; a server silent 1 s longer is dropped.",
    )  # fmt: skip
    job_store_acquire_timeout_s: float = Field(
        default=5.0, gt=0, description="PostgreSQL: longest wait for a pooled connection."
    )
    is_worker: bool = Field(default=True, description="Whether this process runs shards.")
    worker_id: str | None = Field(
        default=None, min_length=1, description="Owner name in leases (default: host-pid-random)."
    )
    region: str | None = Field(
        default=None,
        min_length=1,
        description="This worker's region: it runs no line of a tenant pinned elsewhere.",
    )
    num_shard_runners: int = Field(default=2, ge=1, le=64, description="Shards run at once.")
    lines_per_shard: int = Field(default=1000, ge=1, description="The unit of leasing and rerun.")
    max_lines_in_flight: int = Field(default=256, ge=1, description="Per shard runner.")
    lease_s: float = Field(
        default=30.0, gt=0, description="A shard whose lease is not renewed this long is rerun."
    )
    renew_every_s: float = Field(default=2.0, gt=0, description="Lease renewal period.")
    poll_every_s: float = Field(default=1.0, gt=0, description="Idle wait between store scans.")
    max_file_bytes: int = Field(
        default=DEFAULT_MAX_FILE_BYTES, ge=1, description="Largest upload (413 above it)."
    )
    max_requests_per_batch: int = Field(
        default=DEFAULT_MAX_REQUESTS_PER_BATCH, ge=1, description="Lines in one input file."
    )
    max_requests_per_message_batch: int = Field(
        default=DEFAULT_MAX_REQUESTS_PER_MESSAGE_BATCH, ge=1,
        description="Requests in one Anthropic Message Batch.",
    )  # fmt: skip
    max_listed_errors: int = Field(
        default=10_000, ge=1, description="Validation errors listed one by one (then a count)."
    )
    min_completion_window_s: float = Field(
        default=HOUR_S, gt=0, description="Shortest `completion_window` a batch may ask for."
    )
    max_completion_window_s: float = Field(
        default=7 * DAY_S, gt=0, description="Longest `completion_window`."
    )
    min_expires_after_s: float = Field(
        default=HOUR_S, gt=0, description="Shortest `expires_after` of a file (OpenAI: 1 h)."
    )
    max_expires_after_s: float = Field(
        default=30 * DAY_S, gt=0, description="Longest `expires_after` (OpenAI: 30 days)."
    )
    max_line_retries: int = Field(default=5, ge=0, description="For transient 5xx errors.")
    retry_base_s: float = Field(default=0.05, gt=0, description="First wait before a retry.")
    retry_max_s: float = Field(default=2.0, gt=0, description="Longest wait between retries.")
    line_timeout_ms: float = Field(default=600_000, gt=0, description="Deadline per batch line.")
    isolate_after_attempts: int = Field(
        default=2, ge=1, description="Attempts a shard gets before its lines are bisected."
    )
    result_cache: bool = Field(default=False, description="Reuse results of identical lines.")
    speculation: bool = Field(
        default=True, description="Idle shard runners rerun straggling shards speculatively."
    )
    speculation_slow_factor: float = Field(
        default=3.0, ge=1, description="A straggler ran longer than this times its batch's median."
    )
    speculation_min_running_s: float = Field(
        default=10.0, ge=0, description="...and longer than this many seconds."
    )

    @model_validator(mode="after")
    def _consistent(self) -> JobsConfig:
        if self.renew_every_s >= self.lease_s:
            raise ValueError("jobs.renew_every_s must be shorter than jobs.lease_s")
        if self.retry_base_s > self.retry_max_s:
            raise ValueError("jobs.retry_base_s must not exceed jobs.retry_max_s")
        if self.min_completion_window_s > self.max_completion_window_s:
            raise ValueError("jobs.min_completion_window_s must not exceed the maximum")
        if self.min_expires_after_s > self.max_expires_after_s:
            raise ValueError("jobs.min_expires_after_s must not exceed the maximum")
        if any(not region or not url for region, url in self.region_object_store_urls.items()):
            raise ValueError("jobs.region_object_store_urls needs a region and a URL in each entry")
        return self

    def job_store_url_for(self, data_dir: Path) -> str:
        """The job store URL, defaulting to a SQLite file under `data_dir`."""
        if self.job_store_url:
            return self.job_store_url
        return f"sqlite://{Path(data_dir).resolve() / 'jobs.sqlite3'}"

    def object_store_url_for(self, data_dir: Path) -> str:
        """The object store URL, defaulting to `data_dir/objects`."""
        if self.object_store_url:
            return self.object_store_url
        return str(Path(data_dir).resolve() / "objects")

    def resolved_worker_id(self) -> str:
        """This process's worker id: the configured one, or host, pid and a random suffix."""
        if self.worker_id:
            return self.worker_id
        return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
