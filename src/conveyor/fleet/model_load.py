"""What a worker's heartbeat says about one model's load (pure; the worker and the
simulator build the same entry)."""

from __future__ import annotations

from typing import Any


def generative_load(num_waiting: int, num_running: int, num_batch: int = 0) -> dict[str, Any]:
    """A generative model's heartbeat entry: its engine's sequences waiting plus running
    as its queue depth (as vLLM's gauges count load), the running ones beside, and how
    many of them are batch-job lines (``batch_depth``): the scaling signal counts them,
    the router's load for online requests does not (online goes before batch)."""
    return {"queue_depth": num_waiting + num_running, "running": num_running,
            "batch_depth": num_batch, "service_per_s": 0.0, "is_loaded": True}  # fmt: skip
