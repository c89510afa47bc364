"""A test whose service is missing is skipped on a developer's machine and fails under CI."""

from __future__ import annotations

import socket

import pytest

from tests import postgres, redis_server

# Caught here, so the old behaviour (a skip under CI) fails this test instead of skipping it.
OUTCOMES = (pytest.fail.Exception, pytest.skip.Exception)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket is closed


@pytest.mark.parametrize("ci", ["true", None])
def test_no_redis_skips_or_fails_under_ci(monkeypatch: pytest.MonkeyPatch, ci: str | None) -> None:
    monkeypatch.setattr(redis_server, "REDIS_URL", f"redis://127.0.0.1:{closed_port()}/0")
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci == "true" else pytest.skip.Exception
    with pytest.raises(OUTCOMES) as raised, redis_server.unique_prefix():
        pass
    assert raised.type is expected


@pytest.mark.parametrize("ci", ["true", None])
def test_no_postgres_skips_or_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch, ci: str | None
) -> None:
    monkeypatch.setattr(postgres, "PG_ADMIN_URL", f"postgresql://x@127.0.0.1:{closed_port()}/x")
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci == "true" else pytest.skip.Exception
    with pytest.raises(OUTCOMES) as raised:
        postgres.require_postgres()
    assert raised.type is expected
