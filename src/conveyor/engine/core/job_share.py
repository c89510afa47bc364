"""How much of a step batch-job sequences may take while online traffic is present.

A step runs every scheduled sequence together, so an online request that arrives during a
step waits for all of it, and on a busy device a step's time grows with its tokens (a
prefill of many job prompts at once took seconds on CPU). While online traffic is present
(an online sequence waits or runs, or one did within the last ``linger_s``, 10 s by
default), batch-job sequences get at most ``max_job_tokens`` tokens a step: job decodes
count one each, job prefills are chunked to fit, and those left out sit the step out
keeping their KV blocks. The step an online caller may find in flight stays short, and
the job still computes ``max_job_tokens`` tokens every step. With no online traffic for
``linger_s`` the job has the whole step again.

Pure policy with an injected clock; the scheduler asks once per step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# Seconds online traffic counts as present after its last sequence was seen: long enough
# that sparse interactive callers (one request every few seconds) still find short steps;
# on CPU the capped job loses little throughput, since its steps are compute-bound anyway.
DEFAULT_LINGER_S = 10.0


@dataclass(slots=True, frozen=True)
class JobShareConfig:
    """``max_job_tokens``: a step's job tokens beside online traffic (None: no cap)."""

    max_job_tokens: int | None
    linger_s: float = DEFAULT_LINGER_S

    def __post_init__(self) -> None:
        cap = self.max_job_tokens
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"max_job_tokens must be None or an int >= 1, got {cap!r}")
        if self.linger_s < 0:
            raise ValueError(f"linger_s must be >= 0, got {self.linger_s!r}")


class JobShare:
    """Tracks online presence and says each step's cap on batch-job tokens."""

    def __init__(self, config: JobShareConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._last_online_s: float | None = None

    def job_token_cap(self, has_online: bool) -> int | None:
        """This step's cap on batch-job tokens; None when the job may take the whole step.

        ``has_online``: an online sequence waits or runs now.
        """
        now_s = self._clock()
        if has_online:
            self._last_online_s = now_s
        if self.config.max_job_tokens is None or self._last_online_s is None:
            return None
        if now_s - self._last_online_s > self.config.linger_s:
            return None
        return self.config.max_job_tokens
