"""Priority classes shared by the dynamic batcher and the generation engine."""

from __future__ import annotations

import enum


class Priority(enum.IntEnum):
    """Lower value runs first: online callers wait, batch jobs fill idle capacity."""

    ONLINE = 0
    BATCH = 1
