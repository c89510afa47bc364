"""A Message Batch's inline requests as a batch input file (pure: no store, no I/O).

``{"requests": [{"custom_id", "params"}, ...]}`` becomes one JSONL line per request,
``{"custom_id", "method": "POST", "url": "/v1/messages", "body": params}``: the input file
format the Batch API's shards run. What Conveyor's batches need is checked here, so the
batch cannot fail validation later: custom ids (Anthropic's pattern, unique), and one model
for every request. The params themselves are validated when each request runs, and a bad
one is that request's ``errored`` result, as Anthropic's API reports them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from conveyor.errors import InvalidRequest
from conveyor.jobs.config import JobsConfig
from conveyor.openai_paths import MESSAGES

__all__ = ["MAX_MESSAGE_BATCH_BYTES", "BatchInput", "batch_input", "max_requests_of"]

MAX_MESSAGE_BATCH_BYTES = 256 * 1024 * 1024  # Anthropic's bound on a create body
_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def max_requests_of(config: JobsConfig, endpoint: str) -> int:
    """How many requests a batch for ``endpoint`` may hold: a Message Batch Anthropic's
    bound, any other the Batch API's."""
    if endpoint == MESSAGES:
        return config.max_requests_per_message_batch
    return config.max_requests_per_batch


@dataclass(frozen=True, slots=True)
class BatchInput:
    """The input file's lines (each ending in a newline), the batch's model and its size."""

    lines: list[bytes]
    model: str

    @property
    def num_requests(self) -> int:
        """How many requests the batch holds."""
        return len(self.lines)


def batch_input(body: bytes, *, max_requests: int) -> BatchInput:
    """The input file of a create body; a 400 naming the first problem."""
    requests = _requests_of(body, max_requests)
    seen: set[str] = set()
    lines: list[bytes] = []
    model: str | None = None
    for index, entry in enumerate(requests):
        custom_id, params = _entry(index, entry)
        if custom_id in seen:
            raise InvalidRequest(
                f"custom_id {custom_id!r} appears more than once; each request needs its own",
                param=f"requests[{index}].custom_id",
            )
        seen.add(custom_id)
        model = _same_model(index, params.get("model"), model)
        line = {"custom_id": custom_id, "method": "POST", "url": MESSAGES, "body": params}
        lines.append(orjson.dumps(line) + b"\n")
    if model is None:  # no request at all: refused in `_requests_of`
        raise InvalidRequest("requests must not be empty", param="requests")
    return BatchInput(lines, model)


def _requests_of(body: bytes, max_requests: int) -> list[Any]:
    """The body's ``requests`` list (1 to ``max_requests`` entries)."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise InvalidRequest("the request body must be a JSON object")
    unknown = sorted(set(parsed) - {"requests"})
    if unknown:
        raise InvalidRequest(f"unrecognized request argument: {unknown[0]!r}", param=unknown[0])
    requests = parsed.get("requests")
    if not isinstance(requests, list) or not requests:
        raise InvalidRequest("requests must be a non-empty array", param="requests")
    if len(requests) > max_requests:
        raise InvalidRequest(
            f"a message batch holds at most {max_requests} requests, got {len(requests)}",
            param="requests",
        )
    return requests


def _entry(index: int, entry: Any) -> tuple[str, dict[str, Any]]:
    """One request's ``custom_id`` and ``params``."""
    where = f"requests[{index}]"
    if not isinstance(entry, dict) or set(entry) != {"custom_id", "params"}:
        raise InvalidRequest(f"{where} must be an object with custom_id and params", param=where)
    custom_id, params = entry["custom_id"], entry["params"]
    if not isinstance(custom_id, str) or not _CUSTOM_ID.match(custom_id):
        raise InvalidRequest(
            f"{where}.custom_id must be 1 to 64 letters, digits, '_' or '-'",
            param=f"{where}.custom_id",
        )
    if not isinstance(params, dict):
        raise InvalidRequest(f"{where}.params must be an object", param=f"{where}.params")
    return custom_id, params


def _same_model(index: int, model: Any, batch_model: str | None) -> str:
    """The request's model, which must be the batch's (the first request's)."""
    where = f"requests[{index}].params.model"
    if not isinstance(model, str) or not model:
        raise InvalidRequest(f"{where} must be a non-empty string", param=where)
    if batch_model is not None and model != batch_model:
        raise InvalidRequest(
            f"every request of a message batch must use one model; {where} is {model!r}, "
            f"earlier requests use {batch_model!r}",
            param=where,
        )
    return model
