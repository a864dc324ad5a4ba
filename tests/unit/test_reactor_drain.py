"""The Reactor's drain over an in-process zmq pair (no network): it reads everything that is
waiting, stops when ZMQ_EVENTS says nothing is left (no zmq.Again raised), and the
edge-triggered FD still wakes it for what arrives later."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import zmq

from meshd.testing import async_wait_until
from meshd.transport import Reactor


def _pair() -> tuple[zmq.Context[Any], zmq.Socket[Any], zmq.Socket[Any]]:
    """A fresh context and a connected inproc PAIR: (ctx, inbound, outbound)."""
    ctx: zmq.Context[Any] = zmq.Context()
    endpoint = f"inproc://reactor-{uuid.uuid4().hex}"
    inbound = ctx.socket(zmq.PAIR)
    inbound.bind(endpoint)
    outbound = ctx.socket(zmq.PAIR)
    outbound.connect(endpoint)
    return ctx, inbound, outbound


def test_the_drain_reads_what_waits_and_wakes_again_for_later_messages() -> None:
    async def scenario() -> list[bytes]:
        ctx, inbound, outbound = _pair()
        got: list[bytes] = []
        reactor = Reactor(asyncio.get_running_loop())
        try:
            for i in range(5):
                outbound.send_multipart([b"early", str(i).encode()])
            reactor.add(inbound, lambda frames: got.append(bytes(frames[1])))
            await async_wait_until(lambda: len(got) == 5, 5, what="the five waiting messages")
            for round_ in range(3):  # each arrives after a drain that stopped on EVENTS
                outbound.send_multipart([b"late", f"late{round_}".encode()])
                await async_wait_until(lambda n=6 + round_: len(got) == n, 5, what="a later message")
            return got
        finally:
            reactor.close()
            inbound.close(0)
            outbound.close(0)
            ctx.term()

    got: Any = asyncio.run(scenario())
    assert got == [b"0", b"1", b"2", b"3", b"4", b"late0", b"late1", b"late2"]


def test_a_paused_socket_is_not_read_until_resumed_and_nothing_is_skipped() -> None:
    """The handler pauses the socket after the third message: the drain stops there, the rest
    waits in the socket (not read while paused, however long), and resume reads it in order."""
    async def scenario() -> tuple[list[bytes], list[bytes]]:
        ctx, inbound, outbound = _pair()
        got: list[bytes] = []
        reactor = Reactor(asyncio.get_running_loop())

        def handle(frames: list[bytes]) -> None:
            got.append(bytes(frames[0]))
            if len(got) == 3:
                reactor.pause(inbound)

        try:
            for i in range(10):
                outbound.send(str(i).encode())
            reactor.add(inbound, handle)
            await async_wait_until(lambda: len(got) == 3, 5, what="three messages")
            for i in range(10, 12):  # arrives while paused: must not be read either
                outbound.send(str(i).encode())
            for _ in range(20):
                await asyncio.sleep(0)
            while_paused = list(got)
            reactor.resume(inbound)
            await async_wait_until(lambda: len(got) == 12, 5, what="the rest, after resume")
            return while_paused, got
        finally:
            reactor.close()
            inbound.close(0)
            outbound.close(0)
            ctx.term()

    while_paused, got = asyncio.run(scenario())
    assert while_paused == [b"0", b"1", b"2"]
    assert got == [str(i).encode() for i in range(12)]


def test_soon_inside_a_drain_runs_when_the_drain_ends_and_outside_on_the_next_turn() -> None:
    """``Reactor.soon``: called by a handler during a drain, the callback runs once the drain has
    handled every waiting message (in the same loop turn: before a callback queued with
    ``call_soon`` during the drain); called outside a drain, it waits for the next turn. A
    callback that raises is counted and does not stop the others."""
    async def scenario() -> tuple[list[str], int]:
        loop = asyncio.get_running_loop()
        ctx, inbound, outbound = _pair()
        events: list[str] = []
        reactor = Reactor(loop)

        def boom() -> None:
            raise RuntimeError("a failing end-of-drain callback")

        def handle(frames: list[bytes]) -> None:
            events.append(f"msg{frames[0].decode()}")
            if frames[0] == b"0":
                loop.call_soon(events.append, "call_soon")
                reactor.soon(boom)
                reactor.soon(lambda: events.append("at drain end"))

        try:
            for i in range(3):
                outbound.send_multipart([str(i).encode()])
            reactor.add(inbound, handle)
            await async_wait_until(lambda: "call_soon" in events, 5, what="the drain and its turn")
            reactor.soon(lambda: events.append("next turn"))
            assert events[-1] != "next turn"  # not run inside the call
            await asyncio.sleep(0)
            return events, reactor.handler_errors
        finally:
            reactor.close()
            inbound.close(0)
            outbound.close(0)
            ctx.term()

    events, errors = asyncio.run(scenario())
    assert events == ["msg0", "msg1", "msg2", "at drain end", "call_soon", "next turn"]
    assert errors == 1
