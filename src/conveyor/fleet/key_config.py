"""The ``fleet`` section of the configuration: the fleet's internal key.

Kept free of other Conveyor imports so `conveyor.config.settings` can embed it without a cycle.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, model_validator

# A shared secret shorter than this is too easy to guess (`openssl rand -hex 32` gives 64).
MIN_KEY_CHARS = 16


class FleetConfig(BaseModel):
    """The secret gateways present to workers and workers to each other's chunk servers.

    Give it inline (``internal_key``, or ``CONVEYOR_FLEET_KEY``) or as a file holding it
    (``internal_key_file``, e.g. a mounted Kubernetes secret; surrounding whitespace is
    dropped). Every gateway and worker of a fleet needs the same one. Unset: gateways pass
    clients' keys through, workers check them against their own keys, chunk servers are open.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    internal_key: SecretStr | None = Field(
        default=None, description="The fleet's shared secret (never logged nor shown)."
    )
    internal_key_file: Path | None = Field(
        default=None, description="A file holding the fleet's shared secret."
    )

    _secret: bytes | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _read_key(self) -> FleetConfig:
        if self.internal_key is not None and self.internal_key_file is not None:
            raise ValueError("give at most one of internal_key and internal_key_file")
        if self.internal_key is not None:
            self._secret = _checked(self.internal_key.get_secret_value(), "internal_key")
        elif self.internal_key_file is not None:
            self._secret = _checked(_read(self.internal_key_file), str(self.internal_key_file))
        return self

    @property
    def secret(self) -> bytes | None:
        """The key's bytes, or None when the fleet has no internal key."""
        return self._secret


def _read(path: Path) -> str:
    """The key held in `path`, without surrounding whitespace (a trailing newline)."""
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the fleet key file {path}: {exc}") from None


def _checked(key: str, source: str) -> bytes:
    """The key as bytes, if long enough and sendable in a header (printable ASCII)."""
    if len(key) < MIN_KEY_CHARS:
        raise ValueError(f"the fleet key ({source}) must be at least {MIN_KEY_CHARS} characters")
    if not key.isascii() or not key.isprintable() or " " in key:
        raise ValueError(f"the fleet key ({source}) must be printable ASCII without spaces")
    return key.encode("ascii")
