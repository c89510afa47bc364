"""Batch jobs: OpenAI's Files and Batches API on the durable job and object stores.

`subsystem.JobsSubsystem` is what the app starts; `operations.JobOperations` is what the HTTP
handlers call. A batch is validated and cut into shards by the `planner`, run shard by shard
by `runner` / `shard` (leases, bounded windows, retries, `isolation` of crashing lines), and
assembled into its output and error files by `finalize`; `supervisor` drives the lifecycle.
"""

from conveyor.jobs.config import JobsConfig

__all__ = ["JobsConfig"]
