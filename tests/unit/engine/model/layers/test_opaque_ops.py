"""The opaque ops compiled layers call: each runs what its slot holds, eagerly."""

from __future__ import annotations

import pytest
import torch

from conveyor.engine.model.layers.opaque_ops import (
    attend_op,
    linear_op,
    register,
    step_context,
    step_state,
    write_kv_op,
)

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs


def test_linear_op_runs_the_registered_projection_and_its_fake_gives_the_shape() -> None:
    weight = torch.randn(6, 4)
    slot = register(lambda x: x @ weight.T)
    x = torch.randn(3, 4)
    torch.testing.assert_close(linear_op(x, slot, 6), x @ weight.T)
    with torch._subclasses.FakeTensorMode() as mode:
        fake = linear_op(mode.from_tensor(x), mode.from_tensor(slot), 6)
    assert fake.shape == (3, 6)


def test_slots_are_distinct_and_clear_of_zero_and_one() -> None:
    first, second = register(torch.neg), register(torch.abs)
    assert int(first) >= 2 and int(second) == int(first) + 1
    assert first.dtype == torch.int64 and first.dim() == 0


def test_attend_op_sees_the_running_step() -> None:
    seen = []

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        seen.append(step_state())
        return q.flatten(1).clone()

    slot = register(attend)
    q, kv = torch.randn(2, 3, 4), torch.randn(2, 1, 4)
    with step_context("step 7"):
        out = attend_op(q, kv, kv, slot)
    assert seen == ["step 7"] and out.shape == (2, 12)
    with pytest.raises(RuntimeError, match="no step is running"):
        step_state()


def test_write_kv_op_writes_the_slots_in_place() -> None:
    cache = torch.zeros(2, 3, 2, 1, 4)  # K and V, 3 blocks of 2 slots, 1 head of 4
    k, v = torch.ones(2, 1, 4), torch.full((2, 1, 4), 2.0)
    write_kv_op(cache, torch.tensor([1, 4]), k, v)
    flat = cache.view(2, 6, 1, 4)
    assert flat[0, 1].eq(1).all() and flat[0, 4].eq(1).all() and flat[1, 4].eq(2).all()
    assert flat[0, [0, 2, 3, 5]].eq(0).all()
