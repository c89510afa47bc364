"""Connection handling on a real server process: crashes and keep-alive."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.conftest import SYNTHETIC, Server

pytestmark = pytest.mark.slow


def local_address(response: httpx.Response) -> object:
    """The client's end of the TCP connection that carried ``response``."""
    return response.extensions["network_stream"].get_extra_info("client_addr")


def test_connection_stays_usable_after_a_500(server_factory) -> None:
    server: Server = server_factory({"models": [{**SYNTHETIC, "crash_marker": "CRASH"}]})
    with httpx.Client(base_url=server.api, timeout=10) as client:
        crashed = client.post("/embeddings", json={"model": "syn", "input": "CRASH here"})
        assert crashed.status_code == 500
        assert crashed.json()["error"]["type"] == "server_error"
        assert "close" not in crashed.headers.get("connection", "")
        after = [
            client.post("/embeddings", json={"model": "syn", "input": f"fine {i}"})
            for i in range(20)
        ]
        # Every request went over the one keep-alive connection: none had to reconnect.
        addresses = {local_address(r) for r in [crashed, *after]}
    assert [r.status_code for r in after] == [200] * 20
    assert len(addresses) == 1
