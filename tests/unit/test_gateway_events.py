"""The gateway's SSE buffer (no sockets): numbering, resumption, and gaps reported, never skipped."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import pytest

from meshd.errors import DaemonUnreachable
from meshd.gateway.auth import TokenGuard, find_gateway, remove_files, write_token, write_url
from meshd.gateway.errors import http_status
from meshd.gateway.events import EventBuffer, sse_frame


def test_resume_after_last_event_id() -> None:
    async def scenario() -> None:
        buf = EventBuffer(8)
        for n in range(5):
            buf.append("prompt", {"n": n})
        events, gap = buf.since(2)
        assert gap is None and [e.id for e in events] == [3, 4, 5]
        assert buf.since(5) == ([], None)
        assert sse_frame(events[0]) == b'id: 3\nevent: prompt\ndata: {"n":2}\n\n'

    asyncio.run(scenario())


def test_what_fell_out_is_a_gap() -> None:
    async def scenario() -> None:
        buf = EventBuffer(4)
        for n in range(10):
            buf.append("publication", n)
        events, gap = buf.since(3)
        assert gap is not None and (gap.first, gap.last, gap.missed) == (4, 6, 3)
        assert [e.id for e in events] == [7, 8, 9, 10]
        # a reader with no Last-Event-ID after events were dropped also hears of the gap
        _events, gap = buf.since(0)
        assert gap is not None and gap.missed == 6

    asyncio.run(scenario())


def test_waiters_wake_on_append_and_close() -> None:
    async def scenario() -> None:
        buf = EventBuffer(4)
        assert await buf.wait(0, 0.01) is False
        waiter = asyncio.create_task(buf.wait(0, 5))
        await asyncio.sleep(0)
        buf.append("x", 1)
        assert await waiter is True
        closer = asyncio.create_task(buf.wait(1, 5))
        await asyncio.sleep(0)
        buf.close()
        assert await closer is True and buf.closed

    asyncio.run(scenario())


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer wrong", "bearer TOKEN", "TOKEN",
                                    "Bearer TOKEN "])
def test_token_guard_refuses(header: str | None) -> None:
    guard = TokenGuard("TOKEN")
    assert guard.check(header) is False and guard.refused == 1
    assert guard.check("Bearer TOKEN") is True and guard.refused == 1
    guard.replace("NEW")
    assert guard.check("Bearer TOKEN") is False and guard.check("Bearer NEW") is True


def test_token_file_modes(tmp_path: Path) -> None:
    write_token(tmp_path, "T1")
    assert stat.S_IMODE((tmp_path / "http.token").stat().st_mode) == 0o600
    write_token(tmp_path, "T2", group_readable=True)  # only when the operator sets it
    assert stat.S_IMODE((tmp_path / "http.token").stat().st_mode) == 0o640
    write_url(tmp_path, "http://127.0.0.1:1/")
    found = find_gateway(tmp_path / "meshd.sock")
    assert (found.url, found.token) == ("http://127.0.0.1:1/", "T2")
    remove_files(tmp_path)
    with pytest.raises(DaemonUnreachable):
        find_gateway(tmp_path / "meshd.sock")


def test_status_table() -> None:
    assert http_status("NO_SUCH_AGENT") == 404 and http_status("TOO_MANY_STREAMS") == 429
    assert http_status("TOO_LARGE") == 413 and http_status("SOMETHING_NEW") == 500
