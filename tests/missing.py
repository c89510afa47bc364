"""What a test does when a service it needs is missing: skip here, fail under CI."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def is_ci() -> bool:
    """Under CI (``CI=true``, which ``.ci/run`` sets), where every service must be up."""
    return os.environ.get("CI") == "true"


def missing(reason: str) -> NoReturn:
    """Skip the test on a developer's machine; fail it under CI, which has every service."""
    if is_ci():
        pytest.fail(reason)
    pytest.skip(reason)
