"""The slow-client protocol's clocks and its lingering close, driven by hand: no real
clock, no sockets."""

from __future__ import annotations

import pytest

from conveyor.api.connection_limits import Linger, ReadTimeouts, timeout_response
from conveyor.api.slow_clients import SlowClientProtocol, slow_client_protocol
from conveyor.asgi.disconnect import DISCONNECT_HOOK, DisconnectHook
from tests.unit.api.protocol_fakes import (
    HEAD,
    TIMEOUTS,
    Transport,
    apps_done,
    connect,
    refuse_unread,
)

pytestmark = pytest.mark.anyio


def answered_and_lingering(transport: Transport, status: bytes) -> bool:
    """The server answered ``status`` and half-closed, still reading (see `Linger`)."""
    return (
        transport.written.startswith(b"HTTP/1.1 " + status + b" ")
        and transport.is_eof_written
        and not transport.is_closed
    )


async def test_a_connection_that_sends_nothing_is_closed_quietly() -> None:
    _, loop, transport = connect()
    loop.advance(TIMEOUTS.header_timeout_s - 0.1)
    assert not transport.is_closed
    loop.advance(0.1)
    assert transport.is_closed and transport.written == b""


async def test_a_trickled_head_gets_408_at_the_header_timeout() -> None:
    protocol, loop, transport = connect()
    loop.advance(5)
    protocol.data_received(HEAD[:5])  # the clock runs from connect time: not restarted
    loop.advance(TIMEOUTS.header_timeout_s - 5 - 0.1)
    assert not transport.is_closed
    loop.advance(0.1)
    assert answered_and_lingering(transport, b"408")
    assert b"request_timeout" in transport.written
    loop.advance(Linger().seconds)
    assert transport.is_closed


async def test_the_body_clock_restarts_with_each_chunk_and_stops_when_complete() -> None:
    protocol, loop, transport = connect()
    protocol.data_received(HEAD + b"\r\nab")
    loop.advance(TIMEOUTS.body_timeout_s - 1)
    protocol.data_received(b"c")
    loop.advance(TIMEOUTS.body_timeout_s - 1)  # long after the head, not after the chunk
    assert not transport.is_closed
    protocol.data_received(b"d")
    await apps_done(protocol)
    assert transport.written.startswith(b"HTTP/1.1 200 ")
    loop.advance(3)  # within uvicorn's keep-alive: our clocks are off between requests
    assert not transport.is_closed
    assert len(loop.armed()) <= 2  # ours (lazy, about to lapse) and uvicorn's keep-alive


async def test_a_stalled_body_gets_408_and_the_app_sees_a_disconnect() -> None:
    protocol, loop, transport = connect()
    protocol.data_received(HEAD + b"\r\nab")
    loop.advance(TIMEOUTS.body_timeout_s)
    await apps_done(protocol)
    assert answered_and_lingering(transport, b"408")
    assert b"HTTP/1.1 200" not in transport.written  # the app's answer never follows the 408


async def test_a_body_we_stopped_reading_is_not_the_clients_fault() -> None:
    protocol, loop, transport = connect()
    protocol.data_received(HEAD + b"\r\nab")
    protocol.flow.pause_reading()
    loop.advance(TIMEOUTS.body_timeout_s)
    assert not transport.is_closed
    protocol.flow.resume_reading()  # from here the client must move again, in time
    loop.advance(TIMEOUTS.body_timeout_s)
    assert answered_and_lingering(transport, b"408")


async def test_a_later_request_gets_its_own_header_clock() -> None:
    protocol, loop, transport = connect()
    protocol.data_received(HEAD + b"\r\nabcd")
    await apps_done(protocol)
    assert transport.written.startswith(b"HTTP/1.1 200 ")
    loop.advance(1)
    protocol.data_received(b"GET")  # uvicorn's keep-alive timer is now off: ours is on
    loop.advance(TIMEOUTS.header_timeout_s - 0.1)
    assert not transport.is_closed
    loop.advance(0.1)
    assert transport.is_eof_written and transport.written.count(b"HTTP/1.1 408 ") == 1


async def test_one_timer_serves_many_requests_on_a_connection() -> None:
    protocol, loop, transport = connect()
    for _ in range(50):
        protocol.data_received(HEAD + b"\r\nabcd")
        await apps_done(protocol)
        loop.advance(0.001)
    ours = [t for t in loop.timers if t.callback == protocol._check_deadline]
    assert len(ours) == 1  # armed at connect, never re-armed per request
    assert transport.written.count(b"HTTP/1.1 200 ") == 50


def test_timeout_response_is_complete_http() -> None:
    raw = timeout_response("too slow")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"content-length: %d" % len(body) in head and b"connection: close" in head


def test_timeouts_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        ReadTimeouts(header_timeout_s=0, body_timeout_s=1)


def _hook(protocol: SlowClientProtocol) -> DisconnectHook:
    hook = protocol.scope["extensions"][DISCONNECT_HOOK]
    assert isinstance(hook, DisconnectHook)
    return hook


async def test_a_lost_connection_fires_the_hook_of_the_request_in_flight() -> None:
    protocol, _, _ = connect()
    protocol.data_received(HEAD + b"\r\nab")  # the body is not complete: no answer yet
    hook = _hook(protocol)
    calls: list[str] = []
    hook.watch(lambda: calls.append("gone"))
    protocol.connection_lost(None)
    assert calls == ["gone"] and hook.is_fired
    await apps_done(protocol)


async def test_an_answered_request_retires_its_hook() -> None:
    protocol, _, _ = connect()
    protocol.data_received(HEAD + b"\r\nabcd")
    hook = _hook(protocol)
    hook.watch(lambda: pytest.fail("an answered request is not told of a later disconnect"))
    await apps_done(protocol)
    protocol.connection_lost(None)
    assert not hook.is_fired


RATED = ReadTimeouts(header_timeout_s=10.0, body_timeout_s=30.0, body_min_bytes_per_s=100.0)
LONG_HEAD = b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Length: 10000\r\n\r\n"


def test_a_body_deadline_is_the_sooner_of_a_silence_and_the_rate() -> None:
    # 30 s of grace, then 100 bytes/s on average: 200 bytes buy 2 s more.
    assert RATED.body_deadline(started_s=0, num_bytes=200, last_byte_s=31) == 32
    assert RATED.body_deadline(started_s=0, num_bytes=5000, last_byte_s=1) == 31  # silence
    assert TIMEOUTS.body_deadline(started_s=0, num_bytes=0, last_byte_s=100) == 130  # no rate


def test_a_negative_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="body_min_bytes_per_s"):
        ReadTimeouts(header_timeout_s=1, body_timeout_s=1, body_min_bytes_per_s=-1)


async def test_a_body_below_the_minimum_rate_gets_408_though_never_silent() -> None:
    protocol, loop, transport = connect(slow_client_protocol(RATED))
    protocol.data_received(LONG_HEAD)
    for _ in range(3):  # 1 byte every 10 s: never 30 s of silence, far below 100 bytes/s
        loop.advance(10)
        protocol.data_received(b" ")
    assert not transport.written
    loop.advance(1)  # 30 s of grace and 3 bytes' worth (0.03 s) are spent
    assert answered_and_lingering(transport, b"408")
    assert b"slower than 100 bytes/s" in transport.written
    await apps_done(protocol)


async def test_a_body_at_the_minimum_rate_is_read_whole() -> None:
    protocol, loop, transport = connect(slow_client_protocol(RATED))
    protocol.data_received(LONG_HEAD)
    for _ in range(100):  # 100 bytes/s for 100 s
        loop.advance(1)
        protocol.data_received(b" " * 100)
    await apps_done(protocol)
    assert transport.written.startswith(b"HTTP/1.1 200 ") and not transport.is_eof_written


async def test_an_answer_before_the_body_is_in_closes_the_connection_lingering() -> None:
    protocol, loop, transport = connect(app=refuse_unread)
    protocol.data_received(HEAD + b"\r\n")  # the body (4 bytes) is still to come
    await apps_done(protocol)
    head = transport.written.partition(b"\r\n\r\n")[0]
    assert b"HTTP/1.1 401 " in head and b"connection: close" in head
    assert answered_and_lingering(transport, b"401")
    protocol.data_received(b"abcd" + HEAD + b"\r\nabcd")  # read and dropped: no second answer
    loop.advance(Linger().seconds - 0.1)
    assert transport.written.count(b"HTTP/1.1 ") == 1 and not transport.is_closed
    loop.advance(0.1)
    assert transport.is_closed


async def test_an_answer_after_the_body_keeps_the_connection() -> None:
    protocol, _, transport = connect(app=refuse_unread)
    for _ in range(2):
        protocol.data_received(HEAD + b"\r\nabcd")  # unread by the app, but all in
        await apps_done(protocol)
    assert transport.written.count(b"HTTP/1.1 401 ") == 2
    assert b"connection: close" not in transport.written and not transport.is_eof_written


async def test_a_linger_ends_once_the_client_has_sent_its_share() -> None:
    protocol_class = slow_client_protocol(TIMEOUTS, linger=Linger(seconds=5, max_bytes=100))
    protocol, _, transport = connect(protocol_class, app=refuse_unread)
    protocol.data_received(HEAD.replace(b"4", b"1000") + b"\r\n")
    await apps_done(protocol)
    protocol.data_received(b"x" * 100)
    assert not transport.is_closed
    protocol.data_received(b"x")
    assert transport.is_closed


async def test_a_graceful_shutdown_ends_a_linger_at_once() -> None:
    protocol, _, transport = connect(app=refuse_unread)
    protocol.data_received(HEAD + b"\r\n")
    await apps_done(protocol)
    assert answered_and_lingering(transport, b"401")
    protocol.shutdown()
    assert transport.is_closed


async def test_a_shutdown_during_a_body_is_not_undone_when_the_body_is_in() -> None:
    protocol, _, transport = connect()
    protocol.data_received(HEAD + b"\r\nab")
    protocol.shutdown()  # uvicorn: no keep-alive after the request in progress
    protocol.data_received(b"cd")
    await apps_done(protocol)
    assert transport.written.startswith(b"HTTP/1.1 200 ")
    assert b"connection: close" in transport.written
