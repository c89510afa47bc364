"""Multi-turn chat traffic for ``bench.prefix_routing``: scripted sessions, streamed turns.

Every session shares one system prompt (unless told not to) and sends its turns one after
another, each with the whole conversation so far (earlier replies included, as the server
wrote them), streamed, so the client sees when the first token arrives. The session id
goes in ``user`` or ``prompt_cache_key``, or nowhere (``HINTS``). With several gateways a
session's turns take them in turn; at most ``concurrency`` sessions run at once.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass

import httpx

SYSTEM_PROMPT = (
    "You are the assistant of a batching server. Answer briefly; explain paged attention, "
    "continuous batching and prefix caching when asked, and say so when you do not know."
)
# Words the tiny test tokenizer was trained on: about two tokens each.
_WORD_TEXT = (
    "the quick brown fox jumps over lazy dog batching server groups requests accelerator "
    "stays busy each request streams tokens back sampled continuous admits new sequences "
    "between decode steps paged attention stores keys values fixed size blocks table maps "
    "logical positions physical memory never fragmented hello there help story numbers"
)
_WORDS = _WORD_TEXT.split()
# Sessions start this far apart, so first turns do not all arrive in one burst.
_STAGGER_S = 0.05
# Where a session's id goes in the body: nowhere, ``user``, or ``prompt_cache_key``.
HINTS = ("none", "user", "prompt_cache_key")


@dataclass(frozen=True, slots=True)
class Traffic:
    """How the sessions are sent."""

    max_tokens: int
    think_s: float = 0.0
    hint: str = "user"
    concurrency: int | None = None  # sessions at once (None: all)
    has_system_prompt: bool = True

    def __post_init__(self) -> None:
        """Refuse an unknown hint."""
        if self.hint not in HINTS:
            raise ValueError(f"hint must be one of {HINTS}, got {self.hint!r}")


@dataclass(frozen=True, slots=True)
class SessionScript:
    """One session: its id and the user message of each turn."""

    session_id: str
    user_messages: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TurnResult:
    """One turn as the client saw it."""

    session_id: str
    turn: int
    ttft_s: float
    ok: bool


def session_scripts(num_sessions: int, num_turns: int, rng: random.Random) -> list[SessionScript]:
    """Reproducible sessions of ``num_turns`` user messages of 15-25 words each."""
    return [
        SessionScript(
            f"session-{index}",
            tuple(
                " ".join(rng.choice(_WORDS) for _ in range(rng.randint(15, 25)))
                for _ in range(num_turns)
            ),
        )
        for index in range(num_sessions)
    ]


async def _turn(
    client: httpx.AsyncClient, url: str, body: dict[str, object]
) -> tuple[float, str, bool]:
    """Stream one chat turn: (time to first event, the reply's text, success)."""
    started = time.perf_counter()
    ttft_s = 0.0
    pieces: list[str] = []
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return time.perf_counter() - started, "", False
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if not ttft_s:
                ttft_s = time.perf_counter() - started
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                pieces.append(choice.get("delta", {}).get("content") or "")
    return ttft_s, "".join(pieces), ttft_s > 0


async def _session(
    client: httpx.AsyncClient, urls: list[str], model: str, script: SessionScript,
    traffic: Traffic, first: int,
) -> list[TurnResult]:  # fmt: skip
    """Every turn of one session, in order, each carrying the conversation so far (after
    `think_s` of pause before each follow-up); turn ``i`` goes to ``urls[first + i]``."""
    messages: list[dict[str, str]] = []
    if traffic.has_system_prompt:
        messages.append({"role": "system", "content": SYSTEM_PROMPT})
    results = []
    for turn, text in enumerate(script.user_messages):
        if turn > 0 and traffic.think_s > 0:
            await asyncio.sleep(traffic.think_s)
        messages.append({"role": "user", "content": text})
        body: dict[str, object] = {
            "model": model, "messages": messages, "max_tokens": traffic.max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
        }  # fmt: skip
        if traffic.hint != "none":
            body[traffic.hint] = script.session_id
        url = urls[(first + turn) % len(urls)]
        try:
            ttft_s, reply, ok = await _turn(client, url, body)
        except httpx.HTTPError:
            ttft_s, reply, ok = 0.0, "", False
        results.append(TurnResult(script.session_id, turn, ttft_s, ok))
        messages.append({"role": "assistant", "content": reply})
    return results


async def run_sessions(
    ports: list[int], model: str, scripts: list[SessionScript], traffic: Traffic
) -> list[TurnResult]:
    """The sessions through the gateways on ``ports``, ``concurrency`` at a time; every
    turn's result."""
    urls = [f"http://127.0.0.1:{port}/v1/chat/completions" for port in ports]
    limits = httpx.Limits(max_connections=len(scripts) + 4)
    slots = asyncio.Semaphore(traffic.concurrency or len(scripts))
    async with httpx.AsyncClient(limits=limits, timeout=300) as client:

        async def staggered(index: int, script: SessionScript) -> list[TurnResult]:
            await asyncio.sleep(min(index, traffic.concurrency or index) * _STAGGER_S)
            async with slots:
                return await _session(client, urls, model, script, traffic, index)

        per_session = await asyncio.gather(
            *(staggered(i, script) for i, script in enumerate(scripts))
        )
    return [result for results in per_session for result in results]
