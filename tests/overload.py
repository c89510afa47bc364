"""An open-loop burst of requests at a fixed rate; each answer's status, code and Retry-After.

Open loop: requests go out on schedule whatever the server answers, as a flood of callers
would, so a server that refuses fast is not offered less. Shared by the overload tests on
`serve` and through a gateway.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx

# The client gives up this long after the request's own deadline: a hang is an answer too.
HANG_AFTER_DEADLINE_S = 10.0


@dataclass(frozen=True, slots=True)
class Answer:
    """One response as the overload checks read it (status 0: no answer in time)."""

    status: int
    retry_after: str | None = None
    code: str | None = None


def statuses(answers: list[Answer]) -> Counter[int]:
    """How many answers had each status."""
    return Counter(answer.status for answer in answers)


def burst(
    url: str,
    body: dict[str, Any],
    *,
    num_requests: int,
    rate_per_s: float,
    timeout_ms: float,
) -> list[Answer]:
    """POST ``body`` to ``url`` ``num_requests`` times at ``rate_per_s``, each with the
    deadline header ``timeout_ms``; every answer, in sending order."""
    return asyncio.run(_burst(url, body, num_requests, rate_per_s, timeout_ms))


async def _burst(
    url: str, body: dict[str, Any], num_requests: int, rate_per_s: float, timeout_ms: float
) -> list[Answer]:
    headers = {"X-Conveyor-Timeout-Ms": f"{timeout_ms:.0f}"}
    timeout = httpx.Timeout(timeout_ms / 1000 + HANG_AFTER_DEADLINE_S)
    limits = httpx.Limits(max_connections=num_requests, max_keepalive_connections=num_requests)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        loop = asyncio.get_running_loop()
        started = loop.time()
        tasks = []
        for index in range(num_requests):
            # Sleep to each request's own send time, so a slow send never shifts the rest.
            await asyncio.sleep(max(0.0, started + index / rate_per_s - loop.time()))
            tasks.append(asyncio.create_task(_post(client, url, body, headers)))
        return list(await asyncio.gather(*tasks))


async def _post(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]
) -> Answer:
    try:
        response = await client.post(url, json=body, headers=headers)
    except httpx.TimeoutException:
        return Answer(0)
    code = None
    if response.status_code != 200:
        code = response.json().get("error", {}).get("code")
    return Answer(response.status_code, response.headers.get("retry-after"), code)
