"""The connection budget's bookkeeping: who is busy, who waits, who makes way."""

from __future__ import annotations

import pytest

from conveyor.api.connection_budget import ConnectionBudget


def test_a_new_connection_fits_while_places_are_free() -> None:
    budget = ConnectionBudget[str](3)
    assert [budget.open(name) for name in "abc"] == [None, None, None]
    assert (budget.num_waiting, budget.num_busy) == (3, 0)


def test_at_capacity_the_longest_waiting_makes_way() -> None:
    budget = ConnectionBudget[str](3)
    for name in "abc":
        budget.open(name)
    assert budget.start("a")  # a has sent a head: busy, makes way for no one
    budget.wait("a")  # answered: waits again, as the newest
    assert budget.open("d") == "b"
    assert budget.open("e") == "c"
    assert budget.open("f") == "a"


def test_busy_connections_never_make_way() -> None:
    budget = ConnectionBudget[str](2)
    for name in "ab":
        budget.open(name)
        assert budget.start(name)
    assert budget.open("c") is None  # over the cap: its request will be refused
    assert not budget.start("c")
    assert budget.open("d") == "c"  # a refused newcomer still waits: it makes way too


def test_a_request_is_refused_only_when_every_place_is_busy() -> None:
    budget = ConnectionBudget[str](2)
    for name in "abc":
        budget.open(name)  # c took a's place
    assert budget.start("b") and budget.start("c")
    budget.open("d")
    assert not budget.start("d")
    budget.close("b")
    assert budget.start("d")


def test_a_pipelined_request_keeps_its_place() -> None:
    budget = ConnectionBudget[str](1)
    budget.open("a")
    assert budget.start("a") and budget.start("a")
    assert budget.num_busy == 1


def test_closing_frees_the_place_whatever_the_state() -> None:
    budget = ConnectionBudget[str](2)
    budget.open("a")
    budget.open("b")
    budget.start("b")
    budget.close("a")
    budget.close("b")
    budget.close("b")  # closing twice is harmless
    assert (budget.num_waiting, budget.num_busy) == (0, 0)


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        ConnectionBudget[str](0)
