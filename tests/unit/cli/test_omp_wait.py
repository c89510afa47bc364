"""OpenMP's wait policy: passive unless the environment already chose."""

from __future__ import annotations

from conveyor.cli.omp_wait import prefer_passive_omp_wait


def test_passive_wait_is_set_when_the_environment_is_silent() -> None:
    environ: dict[str, str] = {}
    assert prefer_passive_omp_wait(environ) is True
    assert environ == {"OMP_WAIT_POLICY": "PASSIVE"}


def test_an_explicit_wait_policy_wins() -> None:
    environ = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert prefer_passive_omp_wait(environ) is False
    assert environ == {"OMP_WAIT_POLICY": "ACTIVE"}
