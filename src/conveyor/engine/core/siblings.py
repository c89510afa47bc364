"""Sibling sequences: the n choices of one call share a prompt, so they share its KV blocks.

The prompts of one call that repeat form a prefix group. The scheduler admits one member
and holds the others back while it computes the prompt's full blocks; then they are
admitted as prefix-cache hits, so the prompt is computed once, not n times. Pure logic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from collections.abc import Sequence as Seq

from conveyor.engine.core.sequence import Sequence


def prefix_groups(base_id: str, prompts: Seq[list[int]]) -> list[str | None]:
    """A group per prompt that occurs more than once among ``prompts``, else None."""
    first: dict[tuple[int, ...], int] = {}
    keys = [first.setdefault(tuple(ids), index) for index, ids in enumerate(prompts)]
    counts = Counter(keys)
    return [f"{base_id}-p{key}" if counts[key] > 1 else None for key in keys]


def waits_for_sibling(seq: Sequence, running: Iterable[Sequence], block_size: int) -> bool:
    """Whether a running sibling of ``seq`` still computes the prompt blocks it would share."""
    # Full blocks short of the last prompt token: what a cache hit can cover.
    num_shared = (seq.num_prompt_tokens - 1) // block_size * block_size
    if seq.prefix_group is None or num_shared == 0:
        return False
    return any(
        other.prefix_group == seq.prefix_group and other.num_computed_tokens < num_shared
        for other in running
    )
