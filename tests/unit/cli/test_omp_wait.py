"""OpenMP's wait policy: a short spin unless the environment already chose."""

from __future__ import annotations

import pytest

from conveyor.cli.omp_wait import SPIN_COUNT, prefer_short_omp_spin


def test_a_short_spin_is_set_when_the_environment_is_silent() -> None:
    environ: dict[str, str] = {}
    assert prefer_short_omp_spin(environ) is True
    assert environ == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": str(SPIN_COUNT)}


@pytest.mark.parametrize(
    "chosen",
    [{"OMP_WAIT_POLICY": "ACTIVE"}, {"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "0"}],
)
def test_an_explicit_choice_wins(chosen: dict[str, str]) -> None:
    environ = dict(chosen)
    assert prefer_short_omp_spin(environ) is False
    assert environ == chosen
