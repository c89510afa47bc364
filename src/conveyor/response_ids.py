"""Response ids (Responses API): who makes them and who reads them agree here.

A response id is ``resp_`` and 48 hex digits: 16 name the conversation (a first turn
draws them, a later turn inherits them from its ``previous_response_id``), 32 are its
own. A gateway routes by the conversation key, so every turn of a conversation after the
first goes to the same worker, whose cache holds its prefix.
"""

from __future__ import annotations

import re
import secrets

__all__ = ["RESPONSE_ID_PREFIX", "conversation_key", "new_response_id"]

RESPONSE_ID_PREFIX = "resp_"
_KEY_HEX = 16
_OWN_HEX = 32
_ID = re.compile(rf"^{RESPONSE_ID_PREFIX}([0-9a-f]{{{_KEY_HEX}}})[0-9a-f]{{{_OWN_HEX}}}$")


def new_response_id(previous_id: str | None = None) -> str:
    """A fresh id in the conversation of ``previous_id`` (a new conversation without one)."""
    key = conversation_key(previous_id) if previous_id else None
    key = key or secrets.token_hex(_KEY_HEX // 2)
    return f"{RESPONSE_ID_PREFIX}{key}{secrets.token_hex(_OWN_HEX // 2)}"


def conversation_key(response_id: str) -> str | None:
    """The conversation part of a response id Conveyor made, else None."""
    match = _ID.match(response_id)
    return match.group(1) if match else None
