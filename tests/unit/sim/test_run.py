"""The simulator: deterministic per seed, nothing lost or answered twice, faults recovered."""

from __future__ import annotations

import gc
from typing import Any

from conveyor.sim.clock import Clock
from conveyor.sim.run import COLLECT_THRESHOLD, simulate
from conveyor.sim.scenario import Scenario


def scenario(**changes: Any) -> Scenario:
    """Three H100 workers behind one gateway at a light steady load."""
    raw: dict[str, Any] = {
        "name": "test",
        "duration_s": 8.0,
        "time_model": {"gpu": "h100"},
        "fleet": {"regions": [{"name": "a", "workers": 3}],
                  "engine": {"max_num_seqs": 32, "kv_tokens": 65536}},
        "traffic": [{"kind": "poisson", "rate_rps": 20, "prompt_tokens": {"mean": 200},
                     "output_tokens": {"mean": 20, "dist": "exponential"}}],
    }  # fmt: skip
    raw.update(changes)
    return Scenario.model_validate(raw)


def test_the_clock_runs_events_in_time_then_schedule_order() -> None:
    clock, seen = Clock(), []
    clock.at(2.0, seen.append, "late")
    clock.at(1.0, seen.append, "first")
    clock.at(1.0, seen.append, "second")
    clock.timer(1.5, seen.append, "cancelled").cancel()
    clock.run(10.0)
    assert seen == ["first", "second", "late"]
    assert clock.now == 10.0


def test_a_seed_gives_the_same_run_and_another_seed_another() -> None:
    first, again, other = simulate(scenario(), 1), simulate(scenario(), 1), simulate(scenario(), 2)
    keep = ("wall_seconds", "speed_x", "cpu_seconds")
    strip = lambda t: {k: v for k, v in t.items() if k not in keep}  # noqa: E731
    assert strip(first.totals) == strip(again.totals)
    assert first.series == again.series
    assert strip(first.totals) != strip(other.totals)


def test_a_normal_run_answers_every_request_once() -> None:
    totals = simulate(scenario(), 3).totals
    assert totals["requests"] > 100
    assert totals["completed"] == totals["requests"]
    assert totals["lost"] == totals["duplicated"] == totals["failed_5xx"] == 0


def test_a_killed_worker_mid_load_loses_nothing_its_requests_go_elsewhere() -> None:
    run = simulate(scenario(faults=[{"kind": "kill_worker", "at_s": 4.0, "worker": "w1"}]), 4)
    totals = run.totals
    assert totals["lost"] == totals["duplicated"] == 0
    assert totals["retries"] > 0  # the dead worker's requests were sent again
    assert totals["completed"] + totals["failed_5xx"] + totals["rejected_429"] == totals["requests"]
    assert totals["failed_5xx"] == 0


def test_a_worker_death_mid_batch_re_leases_its_lines_exactly_once() -> None:
    job = {"kind": "batch_job", "lines": 600, "shard_lines": 100, "lease_s": 3.0,
           "renew_every_s": 1.0, "prompt_tokens": {"mean": 100},
           "output_tokens": {"mean": 30}}  # fmt: skip
    run = simulate(scenario(
        traffic=[job], duration_s=2.0, drain_s=60.0,
        faults=[{"kind": "kill_worker", "at_s": 1.0, "worker": "w0"}],
    ), 5)  # fmt: skip
    (result,) = run.totals["jobs"]
    assert result["lines_committed"] == 600
    assert result["shards_committed"] == 6 and result["shards_committed_twice"] == 0
    assert run.totals["lines_wasted"] > 0  # the dead worker's attempt was run again
    assert result["finished_at_s"] > 3.0  # after the lease expired


def test_overload_is_refused_with_429_not_lost() -> None:
    heavy = [{"kind": "poisson", "rate_rps": 300, "prompt_tokens": {"mean": 200},
              "output_tokens": {"mean": 200}, "timeout_s": 5.0}]  # fmt: skip
    totals = simulate(scenario(traffic=heavy, duration_s=4.0), 6).totals
    assert totals["rejected_429"] > 0
    assert totals["lost"] == totals["duplicated"] == 0


def test_only_requests_past_their_deadline_count_as_lost() -> None:
    from conveyor.sim.metrics import Metrics
    from conveyor.sim.request import SimRequest

    metrics = Metrics()
    metrics.arrived(SimRequest(1, "s", "t", [1], 1, arrival_s=0.0, deadline_s=5.0))
    metrics.arrived(SimRequest(2, "s", "t", [1], 1, arrival_s=0.0, deadline_s=50.0))
    assert (metrics.lost(10.0), metrics.unfinished(10.0)) == (1, 1)


def test_staggered_chat_sessions_find_the_system_prompt_cached() -> None:
    def hit_ratio(stagger_s: float) -> float:
        chat = {"kind": "chat", "sessions": 4, "turns": 1, "think_s": 0.0,
                "stagger_s": stagger_s, "shared_prefix_tokens": 64,
                "prompt_tokens": {"mean": 100, "dist": "fixed"},
                "output_tokens": {"mean": 4, "dist": "fixed"}}  # fmt: skip
        run = simulate(
            scenario(traffic=[chat], fleet={"regions": [{"name": "a", "workers": 1}]}), 1
        )
        return float(run.totals["prefix_hit_ratio"])

    # A client starting its sessions 0.5 s apart: the last three reuse the first's 64 tokens.
    assert hit_ratio(0.5) == 3 * 64 / 400
    assert hit_ratio(0.0) == 0.0  # all at once: nothing is cached yet


def test_a_run_collects_garbage_seldom_and_restores_the_collector_after() -> None:
    before = gc.get_threshold()
    seen: list[tuple[int, int, int]] = []
    run_scenario = scenario(duration_s=1.0)
    clock_at = Clock.at

    def spy(self: Clock, *args: Any) -> Any:
        seen.append(gc.get_threshold())
        return clock_at(self, *args)

    Clock.at = spy  # type: ignore[method-assign]
    try:
        simulate(run_scenario, 1)
    finally:
        Clock.at = clock_at  # type: ignore[method-assign]
    assert seen and set(seen) == {COLLECT_THRESHOLD}
    assert gc.get_threshold() == before
