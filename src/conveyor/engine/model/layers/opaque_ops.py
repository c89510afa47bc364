"""Projections and attention as custom ops the compiler calls but does not trace.

A compiled decoder layer (``compiled_layers``) fuses the elementwise work around the
projections and the attention, but cannot trace them: a projection's oneDNN-packed weight
is not a tensor the compiler can reason about, and attention writes the paged KV cache
and loops over the step's prefills and decode buckets. So each is a custom op here that
carries only its activations and a slot number (a 0-d int64 CPU tensor: a tensor, not an
int, so one graph serves every layer's slot). The op looks its module up by slot and runs
it eagerly; its fake implementation gives the compiler the output's shape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import count
from typing import Any

import torch

__all__ = [
    "attend_op",
    "linear_op",
    "register",
    "step_context",
    "step_state",
    "write_kv_op",
]

# slot -> the eager function behind it. Slots start at 2, clear of dynamo's 0/1 specialising.
_IMPLS: dict[int, Callable[..., torch.Tensor]] = {}
_NEXT_SLOT = count(2)
# What the running step's attention calls read (the step, caches and masks): set by
# ``step_context`` around the layers, read by the attention implementations.
_STEP: list[Any] = [None]


def register(impl: Callable[..., torch.Tensor]) -> torch.Tensor:
    """A new slot for ``impl``; returns it as the 0-d tensor the ops take."""
    slot = next(_NEXT_SLOT)
    _IMPLS[slot] = impl
    return torch.tensor(slot, dtype=torch.int64)


@contextmanager
def step_context(state: Any) -> Iterator[None]:
    """Make ``state`` what ``step_state`` returns while the block runs."""
    _STEP[0] = state
    try:
        yield
    finally:
        _STEP[0] = None


def step_state() -> Any:
    """The state of the step being run (see ``step_context``)."""
    if _STEP[0] is None:
        raise RuntimeError("no step is running: attention op called outside step_context")
    return _STEP[0]


# The ops are defined with torch's low-level library API, not ``torch.library.custom_op``:
# that wrapper's per-call checks (defaults, aliasing, the version bump of a mutated input)
# cost about 17 and 31 us a call against 13 for a plain implementation, and a decode step
# makes about 150 of these calls.
_LIB = torch.library.Library("conveyor", "DEF")  # type: ignore[no-untyped-call]


def linear_op(x: torch.Tensor, slot: torch.Tensor, out_features: int) -> torch.Tensor:
    """The projection registered at ``slot`` applied to ``x`` [..., in] -> [..., out]."""
    out: torch.Tensor = torch.ops.conveyor.linear(x, slot, out_features)
    return out


def attend_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot: torch.Tensor
) -> torch.Tensor:
    """The attention registered at ``slot``: writes ``k``, ``v`` [T, kv_heads, dim] to the
    running step's cache and returns [T, heads * dim] for queries ``q`` [T, heads, dim]."""
    out: torch.Tensor = torch.ops.conveyor.attend(q, k, v, slot)
    return out


def write_kv_op(
    kv_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Write ``k``, ``v`` [T, kv_heads, dim] into slots ``slots`` [T] of a layer's cache
    ``kv_cache`` [2 (K, V), blocks, block_size, kv_heads, dim], in place.

    An op, not ``index_copy_`` in the graph: inductor turned an in-graph write to an input
    into a copy of the whole cache; it runs a mutating op on the input itself. K and V
    come as one tensor: as two inputs viewing one storage, the op's input was copied too."""
    torch.ops.conveyor.write_kv(kv_cache, slots, k, v)


def _linear(x: torch.Tensor, slot: torch.Tensor, out_features: int) -> torch.Tensor:
    return _IMPLS[int(slot)](x)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    return _IMPLS[int(slot)](q, k, v)


def _write_kv(
    kv_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    kv_cache[0].view(-1, num_kv_heads, head_dim).index_copy_(0, slots, k)
    kv_cache[1].view(-1, num_kv_heads, head_dim).index_copy_(0, slots, v)


def _linear_fake(x: torch.Tensor, slot: torch.Tensor, out_features: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


def _attend_fake(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot: torch.Tensor
) -> torch.Tensor:
    return q.new_empty((q.shape[0], q.shape[1] * q.shape[2]))


def _write_kv_fake(
    kv_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    return None


def _define(name: str, schema: str, impl: Callable[..., Any], fake: Callable[..., Any]) -> None:
    """Define ``conveyor::<name>`` with its CPU implementation and its fake (for tracing)."""
    _LIB.define(name + schema)  # type: ignore[no-untyped-call]
    _LIB.impl(name, impl, "CPU")  # type: ignore[no-untyped-call]
    torch.library.register_fake(f"conveyor::{name}", fake, lib=_LIB)


_define("linear", "(Tensor x, Tensor slot, int out_features) -> Tensor", _linear, _linear_fake)
_define("attend", "(Tensor q, Tensor k, Tensor v, Tensor slot) -> Tensor", _attend, _attend_fake)
_define(
    "write_kv",
    "(Tensor(a!) kv_cache, Tensor slots, Tensor k, Tensor v) -> ()",
    _write_kv,
    _write_kv_fake,
)
