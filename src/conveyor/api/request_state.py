"""What a route reads from a request besides its body: the caller, the jobs, query numbers.

The API key middleware puts the caller's tenant and principal in ``scope["state"]``; the app
factory puts the jobs subsystem in ``app.state``.
"""

from __future__ import annotations

from fastapi import Request

from conveyor.errors import InvalidRequest
from conveyor.jobs.subsystem import JobsSubsystem
from conveyor.tenants.keyring import ANONYMOUS, Principal


def jobs_of(request: Request) -> JobsSubsystem:
    """The app's jobs subsystem."""
    jobs: JobsSubsystem = request.app.state.jobs
    return jobs


def tenant_of(request: Request) -> str:
    """The caller's tenant, as set by the API key middleware ("default" without keys)."""
    return str(request.scope.get("state", {}).get("tenant", "default"))


def is_admin(request: Request) -> bool:
    """Whether the caller's key is an admin key (set by the API key middleware)."""
    principal = request.scope.get("state", {}).get("principal", ANONYMOUS)
    return isinstance(principal, Principal) and principal.is_admin


def int_param(request: Request, name: str) -> int | None:
    """An optional integer query parameter (400 if it is not an integer)."""
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be an integer", param=name) from None
