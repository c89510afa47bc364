"""glibc malloc: both thresholds set unless the environment already tunes malloc."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from conveyor.cli.malloc_tuning import (
    MMAP_THRESHOLD,
    TRIM_THRESHOLD,
    keep_freed_memory,
    tunes_malloc,
)


class _Mallopt:
    def __init__(self, result: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.result = result

    def __call__(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.result


def test_both_thresholds_are_set_when_the_environment_is_silent() -> None:
    mallopt = _Mallopt()
    assert keep_freed_memory({}, mallopt) is True
    assert mallopt.calls == [(-3, MMAP_THRESHOLD), (-1, TRIM_THRESHOLD)]


@pytest.mark.parametrize(
    "environ",
    [
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"},
        {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F:glibc.malloc.arena_max=2"},
        {"MALLOC_MMAP_THRESHOLD_": "65536"},
        {"MALLOC_ARENA_MAX": "1"},
    ],
)
def test_an_explicit_choice_wins(environ: dict[str, str]) -> None:
    mallopt = _Mallopt()
    assert tunes_malloc(environ)
    assert keep_freed_memory(environ, mallopt) is False
    assert mallopt.calls == []


def test_other_tunables_leave_malloc_to_us() -> None:
    assert not tunes_malloc({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F", "MALLOC": "x"})


def test_a_refused_setting_is_reported() -> None:
    assert keep_freed_memory({}, _Mallopt(result=0)) is False


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_glibc_takes_both() -> None:
    # In a process of its own: the settings would last for the rest of this one.
    code = "from conveyor.cli.malloc_tuning import keep_freed_memory; print(keep_freed_memory({}))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "True"
