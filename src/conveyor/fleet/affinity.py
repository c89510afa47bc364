"""Pure affinity routing: send a request where its prompt prefix is cached, or its session.

Given the routable workers for a model, a request's prompt key and session hint, and a
load function, :func:`choose_by_affinity` picks

1. among workers whose load is within ``load_bound`` of the least loaded, the one holding
   the longest run of the prompt's leading blocks (ties: the less loaded, then the
   session's worker), when any holds at least one block;
2. else, with a session hint, the first worker within the bound in the session's
   rendezvous order (highest-random-weight hashing: a consistent hash, so a worker joining
   or leaving moves only the sessions it gains or held);
3. else nothing, and the caller routes by load alone.

No I/O, no clock, no randomness: every decision replays in tests.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from conveyor.prefix.hashing import chain_hashes, digest_key
from conveyor.prefix.report import PrefixHoldings

__all__ = [
    "Affinity",
    "AffinityReason",
    "AffinitySettings",
    "Holdings",
    "PromptKey",
    "Routable",
    "choose_by_affinity",
    "matched_blocks",
    "rendezvous_order",
]


@dataclass(frozen=True, slots=True)
class AffinitySettings:
    """The knobs: how much busier than the least loaded a preferred worker may be."""

    # In the router's load units (requests in flight from this gateway + reported queue).
    load_bound: int = 4
    use_prefix: bool = True
    use_session: bool = True
    # Leading prompt blocks hashed per request (bounds the gateway's work on long prompts).
    max_prompt_blocks: int = 256
    # Prompt blocks this gateway remembers routing to each worker (0: none; see
    # ``routed_prefixes``), taken as held besides what the worker reports.
    max_routed_blocks: int = 16384

    def __post_init__(self) -> None:
        """Validate the knobs."""
        if self.load_bound < 0:
            raise ValueError(f"load_bound must be >= 0, got {self.load_bound}")
        if self.max_routed_blocks < 0:
            raise ValueError(f"max_routed_blocks must be >= 0, got {self.max_routed_blocks}")
        if self.max_prompt_blocks < 1:
            raise ValueError(f"max_prompt_blocks must be >= 1, got {self.max_prompt_blocks}")


class PromptKey:
    """A prompt's token ids, hashed into digest keys per block size on first use."""

    def __init__(self, token_ids: Sequence[int], max_blocks: int = 256) -> None:
        self.token_ids = tuple(token_ids)
        self.max_blocks = max_blocks
        self._keys: dict[int, tuple[bytes, ...]] = {}

    def keys(self, block_size: int) -> tuple[bytes, ...]:
        """Digest keys of the prompt's reusable leading blocks of ``block_size`` tokens."""
        keys = self._keys.get(block_size)
        if keys is None:
            hashes = chain_hashes(self.token_ids, block_size, self.max_blocks)
            keys = self._keys[block_size] = tuple(digest_key(h) for h in hashes)
        return keys


@dataclass(frozen=True, slots=True)
class Affinity:
    """What a request says about where it would run best."""

    prompt: PromptKey | None = None
    session: str | None = None


class Routable(Protocol):
    """What affinity needs of a worker (``router.WorkerView`` is one)."""

    @property
    def worker_id(self) -> str:
        """The registry id."""

    @property
    def prefixes(self) -> Mapping[str, PrefixHoldings]:
        """Per model, the prefix blocks its cache holds."""


W = TypeVar("W", bound=Routable)


class Holdings(Protocol):
    """Blocks a worker's cache is taken to hold for a model (``PrefixHoldings`` is one)."""

    @property
    def block_size(self) -> int:
        """Tokens per block."""

    @property
    def keys(self) -> Container[bytes]:
        """Digest keys of the blocks held."""


class AffinityReason(enum.StrEnum):
    """Why a worker was chosen (``load``: no affinity applied)."""

    PREFIX = "prefix"
    SESSION = "session"
    LOAD = "load"


def matched_blocks(keys: Sequence[bytes], holdings: Holdings | None) -> int:
    """How many of the prompt's leading blocks the worker holds, counted from the first.

    The engine reuses a cached prefix only up to its first missing block, so a gap ends
    the match.
    """
    if holdings is None:
        return 0
    count = 0
    for key in keys:
        if key not in holdings.keys:
            break
        count += 1
    return count


def rendezvous_order(session: str, workers: Sequence[W]) -> list[W]:
    """``workers`` by descending hash of (session, worker id): the session's preference."""

    def weight(worker: W) -> bytes:
        seed = f"{session}\x00{worker.worker_id}".encode()
        return hashlib.blake2b(seed, digest_size=8).digest()

    return sorted(workers, key=weight, reverse=True)


def choose_by_affinity(
    workers: Sequence[W],
    model: str,
    affinity: Affinity,
    load: Callable[[W], int],
    settings: AffinitySettings,
    holdings: Callable[[W], Holdings | None] | None = None,
) -> tuple[W, AffinityReason] | None:
    """The worker the request's prefix or session points to, within the load bound.

    ``holdings`` says what a worker holds for ``model`` (default: what it reported).
    """
    if not workers:
        return None
    loads = {w.worker_id: load(w) for w in workers}
    ceiling = min(loads.values()) + settings.load_bound
    within = [w for w in workers if loads[w.worker_id] <= ceiling]
    owner = None
    if settings.use_session and affinity.session:
        ids = {w.worker_id for w in within}
        owner = next(w for w in rendezvous_order(affinity.session, workers) if w.worker_id in ids)
    if settings.use_prefix and affinity.prompt is not None:
        held = holdings or (lambda worker: worker.prefixes.get(model))
        best = _longest_prefix(within, affinity.prompt, loads, owner, held)
        if best is not None:
            return best, AffinityReason.PREFIX
    return (owner, AffinityReason.SESSION) if owner is not None else None


def _longest_prefix(
    workers: Sequence[W],
    prompt: PromptKey,
    loads: dict[str, int],
    owner: W | None,
    held: Callable[[W], Holdings | None],
) -> W | None:
    """The worker holding the most leading blocks (at least one).

    Ties (a shared system prompt several workers hold) go to the less loaded, which
    spreads new sessions evenly (hashing a few dozen sessions onto a few workers is
    lumpy), then to the session's worker.
    """
    best: W | None = None
    best_rank = (0, 0, False)
    owner_id = owner.worker_id if owner is not None else None
    for worker in workers:
        holdings = held(worker)
        if holdings is None:
            continue
        rank = (matched_blocks(prompt.keys(holdings.block_size), holdings),
                -loads[worker.worker_id], worker.worker_id == owner_id)  # fmt: skip
        if rank[0] > 0 and (best is None or rank > best_rank):
            best, best_rank = worker, rank
    return best
