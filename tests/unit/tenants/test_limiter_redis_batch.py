"""The Redis limiter's batch encoding, pure: many requests' arguments in one script call,
and each admission's decision and granted shares read back from the flat reply."""

from __future__ import annotations

import pytest

from conveyor.tenants.limiter_redis import decode, encode, settle_op, take_op


def test_a_batch_is_keys_and_arguments_in_order() -> None:
    batch = [
        take_op(["p:a:requests", "p:a:input_tokens"], [("requests", 60, 1), ("input_tokens", 600, 9)], 1.5, [2, 0]),
        settle_op("p:a:input_tokens", 600, 4, 2.0),
        take_op(["p:b:requests"], [("requests", 60, 1)], 3.0),
    ]  # fmt: skip
    keys, args = encode(batch)
    assert keys == ["p:a:requests", "p:a:input_tokens", "p:a:input_tokens", "p:b:requests"]
    assert args == ["t", "1.5", 2, 60, 1, 2, 600, 9, 0, "s", "2.0", 1, 600, 4, 0,
                    "t", "3.0", 1, 60, 1, 0]  # fmt: skip


def test_each_admission_reads_its_own_part_of_the_reply() -> None:
    batch = [
        take_op(["a"], [("requests", 60, 1)], 0.0, [3]),
        settle_op("b", 60, 1, 0.0),
        take_op(["c", "d"], [("requests", 60, 1), ("output_tokens", 120, 200)], 0.0),
    ]
    reply = [0, b"0", b"56", 3, 2, b"40.0", b"60", b"40", 0, 0]
    (first, first_grants), (second, second_grants) = decode(batch, reply)
    assert first.is_admitted and [v.remaining for v in first.views] == [56]
    assert first_grants == [3]
    assert not second.is_admitted and second.refused_by == "output_tokens"
    assert second.retry_after_s == 40.0 and [v.remaining for v in second.views] == [60, 40]
    assert second_grants == [0, 0]


def test_a_short_reply_is_an_error_not_a_wrong_decision() -> None:
    batch = [take_op(["a", "b"], [("requests", 60, 1), ("input_tokens", 60, 1)], 0.0)]
    with pytest.raises(ValueError, match="short"):
        decode(batch, [0, b"0", b"59", b"59", 0])
