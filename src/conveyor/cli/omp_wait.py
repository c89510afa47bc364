"""OpenMP's wait policy for serving processes, set before torch loads.

Between two parallel ops an OpenMP thread either spins (fast to wake, but it holds a core)
or sleeps (the core is free, but every op of a step then pays a wake-up at its barrier).
Unbounded spinning is the worst case on a few shared cores: the spinning threads take the
core the event loop needs, and a descheduled thread stalls every op of a step (a SmolLM2
decode step measured 7x slower on 2 busy cores). Sleeping at once is the other extreme: a
SmolLM2 decode step of 16 rows took 58 ms instead of 37 ms on 2 quiet cores
(``bench/results/decode_step_omp_*.json``).

So ``serve`` and ``worker`` ask libgomp (PyTorch's OpenMP on Linux) for a short spin,
``GOMP_SPINCOUNT``: long enough to bridge the gaps between the ops of a step, short enough
that an idle engine frees its cores within about a millisecond. ``OMP_WAIT_POLICY=PASSIVE``
beside it makes threads sleep at once where the process has more OpenMP threads than
cores (libgomp's own test). OpenMP reads both once, when its library loads (with torch),
so they are set first thing; either one set in the environment leaves both alone.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

__all__ = ["GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "SPIN_COUNT", "prefer_short_omp_spin"]

OMP_WAIT_POLICY = "OMP_WAIT_POLICY"
GOMP_SPINCOUNT = "GOMP_SPINCOUNT"
# Spins before a waiting thread sleeps: about 1 ms by libgomp's estimate (100,000 a ms).
# 10,000 made a 16-row SmolLM2 decode step 40-45 ms against 37-38 ms in two runs on 2 cores.
SPIN_COUNT = 100_000


def prefer_short_omp_spin(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set ``GOMP_SPINCOUNT`` (a short spin) and ``OMP_WAIT_POLICY=PASSIVE`` unless the
    environment sets either; True if set. Call it before torch is imported."""
    target = os.environ if environ is None else environ
    if OMP_WAIT_POLICY in target or GOMP_SPINCOUNT in target:
        return False
    target[OMP_WAIT_POLICY] = "PASSIVE"
    target[GOMP_SPINCOUNT] = str(SPIN_COUNT)
    return True
