"""What a worker's heartbeat says about one model's load (pure; the worker and the
simulator build the same entry)."""

from __future__ import annotations

from typing import Any


def generative_load(num_waiting: int, num_running: int) -> dict[str, Any]:
    """A generative model's heartbeat entry: its engine's sequences waiting plus running
    as its queue depth (as vLLM's gauges count load), the running ones beside."""
    return {"queue_depth": num_waiting + num_running, "running": num_running,
            "service_per_s": 0.0, "is_loaded": True}  # fmt: skip
