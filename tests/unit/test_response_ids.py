"""Response ids carry their conversation: later turns inherit it, strangers' ids have none."""

from __future__ import annotations

from conveyor.response_ids import conversation_key, new_response_id


def test_a_first_turn_starts_a_conversation_and_later_turns_keep_it() -> None:
    first = new_response_id()
    second = new_response_id(first)
    third = new_response_id(second)
    assert first.startswith("resp_") and len(first) == 5 + 48
    assert len({first, second, third}) == 3
    key = conversation_key(first)
    assert key is not None and conversation_key(second) == conversation_key(third) == key
    assert conversation_key(new_response_id()) != key


def test_ids_conveyor_did_not_make_have_no_conversation() -> None:
    for other in ("resp_abc", "resp_" + "g" * 48, "msg_" + "0" * 48, ""):
        assert conversation_key(other) is None
    assert conversation_key(new_response_id("resp_abc")) is not None  # a new conversation
