"""The gateway's own routing index: prompt blocks it routed, per worker, LRU-bounded, and the
router that remembers its choices so a follow-up finds its worker before any heartbeat."""

from __future__ import annotations

import random

import pytest

from conveyor.fleet.affinity import Affinity, AffinityReason, AffinitySettings, PromptKey
from conveyor.fleet.routed_prefixes import MergedHoldings, RoutedPrefixes
from conveyor.fleet.router import Ejections, Router, WorkerView
from conveyor.prefix.report import PrefixHoldings
from tests.unit.fleet.test_affinity import BLOCK, PROMPT, M, holding

EMPTY = PrefixHoldings(BLOCK, frozenset())


def worker(worker_id: str, holdings: PrefixHoldings | None = EMPTY) -> WorkerView:
    """A worker that reported ``holdings`` (None: no prefix report, block size unknown)."""
    return WorkerView(
        worker_id=worker_id, address=f"http://{worker_id}:1", models=frozenset({M}),
        loaded_models=frozenset({M}), last_heartbeat_at=100.0,
        prefixes={} if holdings is None else {M: holdings},
    )  # fmt: skip


def router(max_routed_blocks: int = 64, bound: int = 4) -> Router:
    settings = AffinitySettings(load_bound=bound, max_routed_blocks=max_routed_blocks)
    return Router(random.Random(0), Ejections(5.0), affinity=settings)


def test_the_index_keeps_each_workers_most_recent_blocks() -> None:
    index = RoutedPrefixes(max_blocks=3)
    index.record("a", M, 4, [b"1", b"2"])
    index.record("a", M, 4, [b"3", b"1"])  # 1 is used again: 2 is now the oldest
    index.record("a", M, 4, [b"4"])
    assert [index.holds("a", M, 4, k) for k in (b"1", b"2", b"3", b"4")] == [
        True,
        False,
        True,
        True,
    ]
    assert not index.holds("a", M, 8, b"1") and not index.holds("a", "other", 4, b"1")
    assert not index.holds("b", M, 4, b"1")
    index.record("b", M, 4, [b"9"])
    index.forget_missing({"b"})
    assert index.num_blocks("a") == 0 and index.num_blocks("b") == 1
    with pytest.raises(ValueError, match="max_blocks"):
        RoutedPrefixes(0)


def test_a_prompt_longer_than_the_cap_keeps_its_head() -> None:
    index = RoutedPrefixes(max_blocks=2)
    index.record("a", M, 4, [b"1", b"2", b"3"])
    assert index.holds("a", M, 4, b"1") and index.holds("a", M, 4, b"2")
    assert not index.holds("a", M, 4, b"3")


def test_merged_holdings_are_the_union_of_reported_and_routed() -> None:
    index = RoutedPrefixes(8)
    index.record("a", M, BLOCK, [b"routed"])
    merged = MergedHoldings.of(PrefixHoldings(BLOCK, frozenset({b"told"})), index, "a", M)
    assert merged.block_size == BLOCK
    assert b"told" in merged.keys and b"routed" in merged.keys and b"other" not in merged.keys


def test_a_follow_up_goes_where_its_first_turn_went_before_any_heartbeat() -> None:
    choose = router()
    workers = [worker("a"), worker("b"), worker("c")]
    first = choose.choose(workers, M, 100.0, affinity=Affinity(PromptKey(PROMPT[:21])))
    assert first is not None and choose.num_routed == {"load": 1}
    follow_up = Affinity(PromptKey(PROMPT))  # the same conversation, longer
    for _ in range(5):  # no heartbeat has told anyone that the first worker holds it
        again = choose.choose(workers, M, 100.0, affinity=follow_up)
        assert again is first
    assert choose.num_routed == {"load": 1, "prefix": 5}


def test_without_the_index_the_follow_up_is_routed_by_load() -> None:
    choose = router(max_routed_blocks=0)
    assert choose.routed is None
    workers = [worker("a"), worker("b"), worker("c")]
    choose.choose(workers, M, 100.0, affinity=Affinity(PromptKey(PROMPT[:21])))
    choose.choose(workers, M, 100.0, affinity=Affinity(PromptKey(PROMPT)))
    assert choose.num_routed == {"load": 2}


def test_the_load_bound_still_holds_over_routed_blocks() -> None:
    choose = router(bound=1)
    workers = [worker("a"), worker("b")]
    first = choose.choose(workers, M, 100.0, affinity=Affinity(PromptKey(PROMPT)))
    assert first is not None
    choose.acquire(first.worker_id)
    choose.acquire(first.worker_id)  # two in flight: beyond the bound of one
    other = choose.choose(workers, M, 100.0, affinity=Affinity(PromptKey(PROMPT)))
    assert other is not None and other is not first


def test_a_worker_without_a_prefix_report_gets_nothing_recorded() -> None:
    choose = router()
    lone = worker("a", holdings=None)
    assert choose.choose([lone], M, 100.0, affinity=Affinity(PromptKey(PROMPT))) is lone
    assert choose.routed is not None and choose.routed.num_blocks("a") == 0
    assert choose.holdings(lone, M) is None


def test_reported_holdings_still_count_and_a_vanished_worker_is_forgotten() -> None:
    choose = router()
    workers = [worker("a", holding(10)), worker("b")]
    picked = choose.choose(workers, M, 100.0, affinity=Affinity(PromptKey(PROMPT)))
    assert picked is workers[0] and choose.num_routed == {AffinityReason.PREFIX.value: 1}
    choose.forget_missing({"b"})
    assert choose.routed is not None and choose.routed.num_blocks("a") == 0
