"""The check that paths pages name in code spans exist (docs/_ext/repo_paths)."""

from __future__ import annotations

from pathlib import Path

from docs._ext.repo_paths import missing_paths


def test_paths_are_found_from_the_root_or_the_package(tmp_path: Path) -> None:
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "online.json").write_text("{}")
    (tmp_path / "src" / "conveyor" / "batching").mkdir(parents=True)
    (tmp_path / "src" / "conveyor" / "batching" / "mix.py").write_text("")
    text = "`bench/results/online.json`, `batching/mix.py`, `batching/`, `bench/`"
    assert missing_paths(text, tmp_path) == []


def test_missing_paths_are_named_once_in_order(tmp_path: Path) -> None:
    text = "`engine/core/scheduler.py` then `tests/old/` then `engine/core/scheduler.py` again"
    assert missing_paths(text, tmp_path) == ["engine/core/scheduler.py", "tests/old/"]


def test_what_is_not_a_repository_path_is_not_checked(tmp_path: Path) -> None:
    text = (
        "`/v1/embeddings` `s3://bucket/prefix` `conveyor://llama` `errors.py` `data_dir/cache` "
        "`/models/llama` `conveyor serve a/b.py` `mutants/` `bench/results/device/` `{id}/x.json`"
    )
    assert missing_paths(text, tmp_path) == []
