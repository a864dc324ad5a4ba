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


def test_the_drain_reads_what_waits_and_wakes_again_for_later_messages() -> None:
    async def scenario() -> list[bytes]:
        ctx = zmq.Context()
        endpoint = f"inproc://reactor-{uuid.uuid4().hex}"
        inbound = ctx.socket(zmq.PAIR)
        inbound.bind(endpoint)
        outbound = ctx.socket(zmq.PAIR)
        outbound.connect(endpoint)
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
