"""transport.SendQueue with a fake socket: NOBLOCK sends, order kept once something waits at the
high-water mark, a retry per loop turn, a kick after each send, and ``writable`` for backpressure."""

from __future__ import annotations

import asyncio
from typing import Any

import zmq

from meshd.transport import SendQueue


class FakeSocket:
    """Takes ``room`` messages, then raises zmq.Again until given more room."""

    closed = False

    def __init__(self, room: int) -> None:
        self.room = room
        self.sent: list[list[bytes]] = []

    def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
        assert flags == zmq.NOBLOCK, "the loop must never block on a send"
        if self.room <= 0:
            raise zmq.Again()
        self.room -= 1
        self.sent.append(frames)


class FakeReactor:
    def __init__(self) -> None:
        self.kicks = 0

    def kick(self, sock: Any) -> None:
        self.kicks += 1


def test_order_is_kept_across_the_high_water_mark_and_writable_says_when_it_cleared() -> None:
    async def scenario() -> None:
        sock, reactor = FakeSocket(room=2), FakeReactor()
        q = SendQueue(sock, reactor, asyncio.get_running_loop(), limit=10)  # type: ignore[arg-type]
        for i in range(5):
            q.push([str(i).encode()])
        assert [f[0] for f in sock.sent] == [b"0", b"1"]
        assert len(q) == 3 and not q.writable.is_set()
        # every push that reached the socket kicks the reactor (a send can swallow the read edge);
        # the two queued behind a waiting message did not touch the socket
        assert reactor.kicks == 3
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert len(q) == 3, "still no room: still waiting, nothing dropped"
        sock.room = 10
        await asyncio.wait_for(q.writable.wait(), 5)
        assert [f[0] for f in sock.sent] == [b"0", b"1", b"2", b"3", b"4"]
        assert len(q) == 0
        assert reactor.kicks > 3, "the retry kicks too"

    asyncio.run(scenario())


def test_clear_forgets_what_waits_and_releases_waiters() -> None:
    async def scenario() -> None:
        sock = FakeSocket(room=0)
        q = SendQueue(sock, FakeReactor(), asyncio.get_running_loop(), limit=1)  # type: ignore[arg-type]
        q.push([b"x"])
        assert len(q) == 1 and not q.writable.is_set()
        q.clear()
        assert len(q) == 0 and q.writable.is_set()

    asyncio.run(scenario())
