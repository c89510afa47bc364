"""The mutation report's bookkeeping: where a mutant belongs and how a target scores."""

from __future__ import annotations

from bench.mutation_report import changed_lines, score, source_path, target_of

PATTERNS = ["src/conveyor/batching/*", "src/conveyor/engine/core/scheduler.py"]


def test_a_mutant_name_points_at_its_file_and_target() -> None:
    method = "conveyor.engine.core.scheduler.xǁSchedulerǁ_top_up__mutmut_14"
    function = "conveyor.batching.mix.x_mixed_batch_limit__mutmut_2"
    assert source_path(method) == "src/conveyor/engine/core/scheduler.py"
    assert source_path(function) == "src/conveyor/batching/mix.py"
    assert target_of(source_path(method), PATTERNS) == "engine/core/scheduler.py"
    assert target_of(source_path(function), PATTERNS) == "batching/"


def test_only_the_changed_lines_of_a_diff_are_kept() -> None:
    diff = "--- a.py\n+++ a.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 0\n+    return 1\n"
    assert changed_lines(diff) == ["-    return 0", "+    return 1"]


def test_an_equivalent_mutant_is_no_catch_even_when_it_ran_out_of_time() -> None:
    statuses = ["killed"] * 6 + ["timeout"] * 2 + ["survived"] * 2
    equivalent = [{"status": "timeout"}, {"status": "survived"}]
    figures = score(statuses, equivalent)
    assert (figures["mutants"], figures["equivalent"]) == (10, 2)
    assert figures["caught_non_equivalent"] == 7  # 6 killed + the one timeout that hung
    assert figures["score_non_equivalent"] == 7 / 8  # the unjudged survivor is a miss
