"""One generation request as the engine sees it: tokens, cache progress and state.

Pure data with a little arithmetic; the block manager and the scheduler mutate
it, the model runner never sees it (it gets a ``SeqChunk``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from conveyor.priority import Priority

# Token ids fit in 63 bits: block hashes pack them as unsigned 64-bit values.
TOKEN_ID_LIMIT = 2**63


class SequenceStatus(enum.Enum):
    """Where a sequence is in its life cycle."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(slots=True, eq=False)
class Sequence:
    """A prompt and the tokens generated for it so far.

    ``token_ids`` holds the prompt followed by every generated token.
    ``num_computed_tokens`` counts the leading tokens whose keys/values are in
    the KV cache; the remaining ones (at least the newest sampled token while
    the sequence runs) are computed by upcoming steps.  After a preemption the
    cache is dropped and every token, generated ones included, is recomputed.

    Equality is identity (``eq=False``): two requests with the same content are
    still two sequences, and the scheduler keeps them in sets and lists.
    """

    seq_id: str
    prompt_token_ids: list[int]
    priority: Priority = Priority.ONLINE
    # Admission counter from the caller; orders sequences of equal priority.
    arrival: int = 0
    # Sequences of one group share their prompt (the n choices of a request): the scheduler
    # admits one, and the others once its prompt is cached, so they compute it only once.
    prefix_group: str | None = None
    # The LoRA adapter this sequence runs with (0: the base model alone). Ids are never
    # reused, so the KV blocks of one adapter are never served to another.
    adapter_id: int = 0
    # False: every position is computed, none served from the prefix cache (prompt
    # logprobs need each position's logits); its blocks still enter the cache for others.
    uses_prefix_cache: bool = True
    token_ids: list[int] = field(init=False)
    num_computed_tokens: int = field(init=False, default=0)
    block_table: list[int] = field(init=False, default_factory=list)
    num_cached_tokens: int = field(init=False, default=0)
    status: SequenceStatus = field(init=False, default=SequenceStatus.WAITING)
    num_preemptions: int = field(init=False, default=0)
    # Memo of the block manager: the hash chain of the leading full blocks for
    # blocks of ``block_hash_size`` tokens.  Full blocks never change (tokens
    # are only appended), so the chain is computed once, not at every lookup.
    block_hashes: list[bytes] = field(init=False, default_factory=list, repr=False)
    block_hash_size: int = field(init=False, default=0, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.seq_id, str) or not self.seq_id:
            raise ValueError("seq_id must be a non-empty string")
        if not self.prompt_token_ids:
            raise ValueError(f"sequence {self.seq_id!r}: prompt_token_ids must not be empty")
        check_token_ids(self.seq_id, self.prompt_token_ids)
        if isinstance(self.arrival, bool) or not isinstance(self.arrival, int):
            raise ValueError(f"sequence {self.seq_id!r}: arrival must be an int")
        if self.arrival < 0:
            raise ValueError(f"sequence {self.seq_id!r}: arrival must be >= 0, got {self.arrival}")
        if self.prefix_group is not None and not (
            isinstance(self.prefix_group, str) and self.prefix_group
        ):
            raise ValueError(f"sequence {self.seq_id!r}: prefix_group must be a non-empty string")
        if isinstance(self.adapter_id, bool) or not isinstance(self.adapter_id, int):
            raise ValueError(f"sequence {self.seq_id!r}: adapter_id must be an int")
        if self.adapter_id < 0:
            raise ValueError(f"sequence {self.seq_id!r}: adapter_id must be >= 0")
        if not isinstance(self.uses_prefix_cache, bool):
            raise ValueError(f"sequence {self.seq_id!r}: uses_prefix_cache must be a bool")
        # Accepts plain ints too; raises ValueError for an unknown class.
        self.priority = Priority(self.priority)
        # Copies so later edits of the caller's list cannot change the request.
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens in the original prompt."""
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        """A copy of the generated tokens."""
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to run through the model before the next sample."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """Whether the sequence still has to catch up before it can decode.

        A decode computes exactly one token: the one this sequence sampled last,
        with everything before it already cached.  Anything else (no sample yet,
        or several tokens to compute after a preemption) is a prefill.
        """
        return self.num_output_tokens == 0 or self.num_computed_tokens < len(self.token_ids) - 1

    @property
    def is_finished(self) -> bool:
        """Whether the sequence has left the engine (finished or aborted)."""
        return self.status in (SequenceStatus.FINISHED, SequenceStatus.ABORTED)

    def append_token(self, token_id: int) -> None:
        """Record a newly sampled token; its KV is computed by the next step."""
        # The common case (a plain int in range) without a call; anything else is checked.
        if type(token_id) is not int or not 0 <= token_id < TOKEN_ID_LIMIT:
            check_token_id(self.seq_id, token_id)
        self.token_ids.append(token_id)


def check_token_ids(seq_id: str, token_ids: list[int]) -> None:
    """``check_token_id`` for each of ``token_ids``: plain ints in range are recognised in
    bulk (a prompt is thousands of them), anything else is checked one by one."""
    is_plain = bool(token_ids) and set(map(type, token_ids)) == {int}
    if is_plain and min(token_ids) >= 0 and max(token_ids) < TOKEN_ID_LIMIT:
        return
    for token_id in token_ids:
        check_token_id(seq_id, token_id)


def check_token_id(seq_id: str, token_id: int) -> None:
    """Raise ValueError unless ``token_id`` is an int that fits in 63 bits.

    Block hashes pack token ids as unsigned 64-bit values, hence the range.
    """
    if isinstance(token_id, bool) or not isinstance(token_id, int):
        raise ValueError(f"sequence {seq_id!r}: token ids must be ints, got {token_id!r}")
    if not 0 <= token_id < TOKEN_ID_LIMIT:
        raise ValueError(f"sequence {seq_id!r}: token id {token_id} is out of range")
