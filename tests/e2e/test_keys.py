"""`conveyor keys` and tenant limits against a real `serve`: keys work until revoked (5 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.conftest import SYNTHETIC, start_server, stop_server
from tests.polling import until

REVOCATION_DEADLINE_S = 5.0


def keys_cli(data_dir: Path, *args: str) -> str:
    """Run `conveyor keys ARGS --data-dir DATA_DIR` and return its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "conveyor", "keys", *args, "--data-dir", str(data_dir)],
        capture_output=True, text=True, check=True, env=os.environ.copy(), timeout=60,
    )  # fmt: skip
    return done.stdout


def test_created_key_works_and_revoked_key_is_refused_within_5_s(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"  # where start_server keeps the server's data
    created = json.loads(keys_cli(data_dir, "create", "--tenant", "acme", "--json"))
    assert set(created) == {"id", "key", "tenant"} and created["tenant"] == "acme"
    assert created["key"].startswith("sk-cv-") and len(created["key"]) >= 6 + 43
    server = start_server(tmp_path, {"models": [SYNTHETIC]})
    try:
        check_key_lifecycle(server.api, data_dir, created)
    finally:
        stop_server(server)


def check_key_lifecycle(api: str, data_dir: Path, created: dict[str, Any]) -> None:
    """The key works, is listed without itself, then stops working within 5 s of revoking."""
    headers = {"Authorization": f"Bearer {created['key']}"}
    assert httpx.get(f"{api}/models").status_code == 401
    assert httpx.get(f"{api}/models", headers=headers).status_code == 200

    listed = json.loads(keys_cli(data_dir, "list", "--json"))
    assert [k["id"] for k in listed] == [created["id"]]
    assert created["key"] not in json.dumps(listed)

    keys_cli(data_dir, "revoke", created["id"])
    until(lambda: httpx.get(f"{api}/models", headers=headers).status_code == 401,
          "the revoked key to be refused", timeout_s=REVOCATION_DEADLINE_S)  # fmt: skip
    listed = json.loads(keys_cli(data_dir, "list", "--json"))
    assert listed[0]["revoked_at"] is not None and listed[0]["last_used_at"] is not None


def test_serve_limits_a_tenant_s_requests_per_minute(tmp_path: Path) -> None:
    config = {"models": [SYNTHETIC], "default_tenant_limits": {"rpm": 2}}
    server = start_server(tmp_path, config)
    try:
        answers = [
            httpx.post(f"{server.api}/embeddings", json={"model": "syn", "input": "x"})
            for _ in range(3)
        ]
    finally:
        stop_server(server)
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert [a.headers["x-ratelimit-remaining-requests"] for a in answers] == ["1", "0", "0"]
    assert answers[2].json()["error"]["code"] == "rate_limit_exceeded"
    assert int(answers[2].headers["retry-after"]) >= 1
