"""The receiving agent's path alone (no sockets): frame sets as a sending client's ``Batcher``
builds them (daemons forward them unchanged) fed to a real, unconnected ``Agent``'s
``Incoming.on_frames``, the function its reactor calls. Guards the lean path (one-way speed): every
``Message`` field from the header, handler slots taken in the middle of a batch, arrival order."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgpack

from meshd import DEFER, Agent, Message
from meshd.client.batching import Batcher, BatchKey, to_agent
from meshd.wire import protocol as P
from meshd.wire.protocol import Kind


def batches(key: BatchKey, items: list[tuple[dict[str, Any], Any]], batch_max: int = 64) -> list[list[bytes]]:
    """The frame sets a client named ``sender`` sends for ``items`` (queued in one loop turn)."""
    out: list[list[bytes]] = []
    sender = Batcher("sender", batch_max=batch_max, max_payload_bytes=P.DEFAULT_MAX_PAYLOAD_BYTES,
                     push=out.append, schedule=lambda fn: None, busy=lambda: True,
                     on_batch=lambda bid, ids: None)
    for header, payload in items:
        sender.enqueue(key, header, msgpack.packb(payload, use_bin_type=True))
    sender.flush()
    return out


def agent(limit: int = 64) -> Agent:
    return Agent("recv", socket="/nonexistent/receive-path-test.sock", max_concurrent_handlers=limit)


def test_every_message_field_comes_from_the_header_single_and_in_a_batch() -> None:
    async def scenario() -> None:
        me = agent()
        seen: list[Message] = []

        @me.on("t")
        async def handler(msg: Message) -> Any:
            seen.append(msg)
            return DEFER  # answered later: nothing leaves the unconnected agent

        request = {P.KIND: Kind.REQUEST, P.ID: "r1", P.FROM: "asker", P.TO: "recv", P.TOPIC: "t",
                   P.CORR: "c1", P.ORIGIN: "first-asker", P.HOPS: 2, P.BUDGET: 5000,
                   P.HEADERS: {"traceparent": "00-x"}}
        before = time.monotonic()
        me._incoming.on_frames(P.frames(request, msgpack.packb({"q": 1})))
        sends = [({P.KIND: Kind.SEND, P.ID: f"s{i}", P.TOPIC: "t"}, i) for i in range(3)]
        for frames in batches(to_agent("recv"), sends):
            me._incoming.on_frames(frames)
        req, *sent = seen
        assert (req.id, req.kind, req.topic, req.sender, req.to, req.payload) == \
            ("r1", Kind.REQUEST, "t", "asker", "recv", {"q": 1})
        assert (req.correlation_id, req.reply_to, req.hops, req.qos, req.headers) == \
            ("c1", "first-asker", 2, 0, {"traceparent": "00-x"})
        assert req.deadline is not None and before + 4.9 < req.deadline <= time.monotonic() + 5.0
        assert req.is_request and req.time_left is not None and 0 < req.time_left <= 5.0
        assert [(m.id, m.kind, m.sender, m.to, m.payload, m.correlation_id, m.deadline, m.reply_to,
                 m.headers) for m in sent] == \
            [(f"s{i}", Kind.SEND, "sender", "recv", i, None, None, "sender", {}) for i in range(3)]
        assert all(not m.is_request and m.qos == 0 and m.hops == 0 for m in sent)
        assert sent[0].headers is not sent[1].headers, "each message has a headers map of its own"

    asyncio.run(scenario())


def test_handler_slots_filling_in_the_middle_of_a_batch_park_the_rest_in_order() -> None:
    async def scenario() -> None:
        me = agent(limit=2)
        release = asyncio.Event()
        started: list[int] = []
        done: list[int] = []

        @me.on("t")
        async def handler(msg: Message) -> None:
            started.append(msg.payload)
            if msg.payload % 3 == 0:  # 0, 3, 6: suspend (each holds a slot until released)
                await release.wait()
            done.append(msg.payload)

        sends = [({P.KIND: Kind.SEND, P.ID: f"s{i}", P.TOPIC: "t"}, i) for i in range(8)]
        [frames] = batches(to_agent("recv"), sends)
        me._incoming.on_frames(frames)
        slots = me._handler_slots
        # 0 suspends (slot 1), 1 and 2 finish at once, 3 suspends (slot 2): the rest must wait.
        assert started == [0, 1, 2, 3] and done == [1, 2]
        assert slots.running == 2 and [h[P.ID] for h, _, _ in slots.parked] == [f"s{i}" for i in range(4, 8)]
        release.set()
        for _ in range(20):
            await asyncio.sleep(0)
        assert started == list(range(8)), "parked work ran in arrival order"
        assert sorted(done) == list(range(8)) and slots.running == 0 and not slots.parked

    asyncio.run(scenario())
