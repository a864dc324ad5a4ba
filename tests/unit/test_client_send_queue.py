"""The agent's send queue on real ZeroMQ sockets: what the socket refuses waits, data lowest
priority first and FIFO within one, control frame sets (barriers) in their place."""

from __future__ import annotations

import asyncio
from typing import Any

import zmq

from meshd.client.send_queue import PrioritySendQueue
from meshd.transport import Reactor


def test_waiting_data_goes_by_priority_between_barriers() -> None:
    async def scenario() -> list[bytes]:
        ctx: zmq.Context[Any] = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        loop = asyncio.get_running_loop()
        reactor = Reactor(loop)
        queue = PrioritySendQueue(dealer, reactor, loop, 100)
        try:
            # no peer yet: a DEALER refuses every NOBLOCK send, so everything waits
            queue.push_data([b"p9-0"], 9)
            queue.push_data([b"p9-1"], 9)
            queue.push_data([b"p0-0"], 0)
            queue.push([b"barrier"])  # a control call: after all the above, before all below
            queue.push_data([b"p9-2"], 9)
            queue.push_data([b"p5-0"], 5)
            queue.push_data([b"p0-1"], 0)
            assert len(queue) == 7 and not queue.writable.is_set()
            endpoint = "inproc://send-queue-test"
            router.bind(endpoint)
            dealer.connect(endpoint)
            await asyncio.wait_for(queue.writable.wait(), 10)
            assert len(queue) == 0
            got = []
            for _ in range(7):
                assert router.poll(5000)
                got.append(router.recv_multipart()[1])
            return got
        finally:
            dealer.close(0)
            router.close(0)
            ctx.term()

    assert asyncio.run(scenario()) == [b"p0-0", b"p9-0", b"p9-1", b"barrier", b"p0-1", b"p5-0", b"p9-2"]
