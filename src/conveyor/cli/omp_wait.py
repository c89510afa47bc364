"""OpenMP's wait policy for serving processes, set before torch loads.

By default OpenMP's threads spin at the end of every parallel region, waiting for the next.
A serving process runs an event loop and an engine thread beside them on the same few
cores: spinning threads take the core the event loop needs, and a descheduled thread
stalls every op of a step at its barrier. On 2 shared cores a decode step of SmolLM2
measured 7x slower with 2 spinning threads than with passive ones. OpenMP reads
``OMP_WAIT_POLICY`` once, when its library loads (with torch), so ``serve`` and ``worker``
call :func:`prefer_passive_omp_wait` first thing.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

__all__ = ["OMP_WAIT_POLICY", "prefer_passive_omp_wait"]

OMP_WAIT_POLICY = "OMP_WAIT_POLICY"


def prefer_passive_omp_wait(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the environment already says; True if set.

    Call it before torch is imported (an explicit ``OMP_WAIT_POLICY=ACTIVE`` wins).
    """
    target = os.environ if environ is None else environ
    if OMP_WAIT_POLICY in target:
        return False
    target[OMP_WAIT_POLICY] = "PASSIVE"
    return True
