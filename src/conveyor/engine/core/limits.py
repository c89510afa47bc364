"""The two limits a generative model must meet to start, as one-line messages (torch-free).

Shared by ``cli.startup_checks`` (before anything loads) and the generator factory (at load), so
``check-config``, ``serve`` and the engine say the same thing.
"""

from __future__ import annotations

import math


def max_model_len_problem(name: str, max_model_len: int, checkpoint_len: int) -> str | None:
    """The message for a ``max_model_len`` above the checkpoint's own limit, if it is."""
    if max_model_len <= checkpoint_len:
        return None
    return (
        f"model {name!r}: max_model_len {max_model_len} exceeds the checkpoint's "
        f"{checkpoint_len} (max_position_embeddings)"
    )


def kv_pool_problem(
    name: str, max_model_len: int, kv_cache_tokens: int, block_size: int
) -> str | None:
    """The message for a KV cache that cannot hold one sequence of ``max_model_len``."""
    needed = math.ceil(max_model_len / block_size)
    available = math.ceil(kv_cache_tokens / block_size)
    if needed <= available:
        return None
    return (
        f"model {name!r}: kv_cache_tokens {kv_cache_tokens} ({available} blocks of "
        f"{block_size}) cannot hold one sequence of max_model_len {max_model_len} "
        f"({needed} blocks); raise kv_cache_tokens or lower max_model_len"
    )
