"""The fleet key: where it comes from, how it is compared, and the caller headers beside it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from conveyor.config.settings import load_config
from conveyor.errors import ConfigError
from conveyor.fleet import credential as credential_module
from conveyor.fleet.credential import (
    ADMIN_HEADER,
    TENANT_HEADER,
    FleetCredential,
    credential_from,
    vouch_headers,
    vouched_principal,
)
from conveyor.fleet.key_config import FleetConfig
from conveyor.tenants.keyring import Principal

KEY = "fleet-key-0123456789abcdef"


def test_the_key_comes_inline_from_a_file_or_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "fleet.key"
    path.write_text(f"  {KEY}\n")
    inline = FleetConfig.model_validate({"internal_key": KEY})
    from_file = FleetConfig.model_validate({"internal_key_file": str(path)})
    from_env = load_config(env={"CONVEYOR_FLEET_KEY": KEY}).fleet
    assert inline.secret == from_file.secret == from_env.secret == KEY.encode()
    assert FleetConfig().secret is None and credential_from(FleetConfig()) is None
    # A blank variable (a template's unfilled Secret) sets nothing.
    assert load_config(env={"CONVEYOR_FLEET_KEY": ""}).fleet.secret is None


@pytest.mark.parametrize(
    ("fleet", "message"),
    [
        ({"internal_key": "short"}, "at least 16 characters"),
        ({"internal_key": "not ascii: \u00e9\u00e9\u00e9\u00e9\u00e9\u00e9"}, "printable ASCII"),
        ({"internal_key": KEY, "internal_key_file": "/k"}, "at most one"),
        ({"internal_key_file": "/nonexistent/fleet.key"}, "cannot read"),
    ],
)
def test_bad_keys_are_config_errors_that_never_echo_the_key(
    fleet: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        load_config(overrides={"fleet": fleet}, env={})
    assert "internal_key" in str(error.value) or "fleet" in str(error.value)
    for value in fleet.values():
        if value.startswith("not ascii") or value == KEY:
            assert value not in str(error.value)


def test_the_key_never_shows_in_a_repr_or_a_dump() -> None:
    config = load_config(env={"CONVEYOR_FLEET_KEY": KEY})
    credential = credential_from(config.fleet)
    assert credential is not None
    for shown in (repr(config), str(config.model_dump()), repr(credential)):
        assert KEY not in shown


def test_a_token_is_compared_by_digest_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = credential_module.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(credential_module.hmac, "compare_digest", spy)
    credential = FleetCredential(KEY.encode())
    assert credential.matches(KEY.encode())
    assert not credential.matches(b"x")
    assert not credential.matches(KEY.encode() + b"x")
    assert credential.matches_digest(hashlib.sha256(KEY.encode()).digest())
    # Every comparison is of two 32-byte digests: a token's length changes nothing.
    assert len(compared) == 4 and {(len(a), len(b)) for a, b in compared} == {(32, 32)}
    assert credential.authorization == b"Bearer " + KEY.encode()
    with pytest.raises(ValueError):
        FleetCredential(b"short")


@pytest.mark.parametrize("tenant", ["acme", "Acme Corp/EU", "caf\u00e9", "a%20b", "x\r\ny"])
@pytest.mark.parametrize("is_admin", [False, True])
def test_the_vouched_caller_survives_the_trip(tenant: str, is_admin: bool) -> None:
    headers = vouch_headers(tenant, is_admin)
    assert all(value.isascii() and b"\r" not in value for _, value in headers)
    assert vouched_principal([(b"x-other", b"1"), *headers]) == Principal(tenant, is_admin)


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [(ADMIN_HEADER, b"1")],
        [(TENANT_HEADER, b"")],
        [(TENANT_HEADER, b"a"), (TENANT_HEADER, b"b")],
        [(TENANT_HEADER, b"%ff")],  # not UTF-8 once decoded
        [(TENANT_HEADER, "caf\u00e9".encode())],  # raw, not percent-encoded
    ],
)
def test_a_missing_repeated_or_malformed_tenant_vouches_for_no_one(
    headers: list[tuple[bytes, bytes]],
) -> None:
    assert vouched_principal(headers) is None


def test_only_admin_header_1_makes_an_admin() -> None:
    tenant = (TENANT_HEADER, b"acme")
    for value, is_admin in ((b"true", False), (b"0", False), (b"1", True)):
        assert vouched_principal([tenant, (ADMIN_HEADER, value)]) == Principal("acme", is_admin)
