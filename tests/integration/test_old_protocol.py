"""A client of the previous protocol revision is served or told why, never left waiting.

A raw DEALER speaks the batch form of docs/PROTOCOL.md before batches declared ``kinds``
(commit a30da3b): ``{kind: "batch", id, from, to, count}`` with requests inside. Its
daemon used to forward such a batch undecoded and the receiving client dropped the requests (not
declared), so the old client waited out its timeouts in silence. The version policy (§4.4) says
the daemon keeps serving the old form: here each request is answered, across two daemons, a forged
answer hidden in an old-form batch is refused as any forged answer is, and an old-form batch whose
body does not decode is answered with an error naming it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import zmq

from meshd import Agent
from meshd.testing import (
    MeshdFactory,
    async_wait_until,
    raw_agent,
    recv_skipping_pings,
    register_raw,
    wait_listed,
)
from meshd.wire import protocol as P


def _old_batch(bid: str, to: str, items: list[list[Any]]) -> list[bytes]:
    """The previous revision's batch: no ``kinds`` in the header."""
    header = {"kind": "batch", "id": bid, "from": "oldie", "to": to, "count": len(items)}
    return [P.SIGNATURE, msgpack.packb(header), msgpack.packb(items)]


def test_old_form_batches_are_served_or_refused_never_dropped(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    ctx, raw = raw_agent(a.socket)

    async def scenario() -> None:
        async with Agent("worker", socket=b.socket) as worker, Agent("helper", socket=a.socket) as helper:
            asked: list[Any] = []
            noted: list[Any] = []

            @worker.on("think")
            async def think(msg: Any) -> Any:
                asked.append(msg.payload)
                return {"thought": msg.payload}

            worker.on("note")(lambda msg: noted.append(msg.payload))
            await register_raw(raw, "oldie")
            await wait_listed(helper, "worker")
            # 1. requests (and a send) batched the old way, to an agent on another daemon: answered
            raw.send_multipart(_old_batch("old-1", "worker", [
                [{"kind": "request", "id": "q1", "topic": "think"}, msgpack.packb(1)],
                [{"kind": "send", "id": "s1", "topic": "note"}, msgpack.packb("by the way")],
                [{"kind": "request", "id": "q2", "topic": "think"}, msgpack.packb(2)]]))
            replies = [await asyncio.to_thread(recv_skipping_pings, raw) for _ in range(2)]
            assert sorted((r["kind"], r["corr"]) for r in replies) == [("reply", "q1"), ("reply", "q2")]
            assert sorted(asked) == [1, 2] and noted == ["by the way"]
            # 2. an answer to a request never delivered to oldie, hidden in an old-form batch:
            # refused like any forged answer (it was dropped unseen by the receiving client before)
            raw.send_multipart(_old_batch("old-2", "helper", [
                [{"kind": "reply", "id": "f1", "corr": "not-yours"}, msgpack.packb("forged")]]))
            refused = await asyncio.to_thread(recv_skipping_pings, raw)
            assert refused["kind"] == "error" and refused["error"]["code"] == "VALIDATION_FAILED", refused
            # 3. an old-form batch whose body is not a batch body: an error naming it, not silence
            header = {"kind": "batch", "id": "old-3", "from": "oldie", "to": "worker", "count": 1}
            raw.send_multipart([P.SIGNATURE, msgpack.packb(header), b"\x93garbage"])
            err = await asyncio.to_thread(recv_skipping_pings, raw)
            assert err["kind"] == "error" and err["error"]["code"] == "VALIDATION_FAILED", err
            assert err["corr"] == "old-3" and "malformed batch" in err["error"]["message"]

    try:
        asyncio.run(scenario())
    finally:
        raw.close(0)
        ctx.term()
    stats = a.query("node")["stats"]  # (info() is cached from the start)
    assert stats["batches_without_kinds"] == 2 and stats["malformed_batch"] == 1
    assert a.alive() and b.alive()


def test_an_old_form_batch_from_a_peer_reaches_the_handler(meshd_factory: MeshdFactory) -> None:
    """A daemon of the previous revision relays its clients' batches without ``kinds``: the
    receiving daemon completes them, so its client handles the requests instead of dropping them."""
    a = meshd_factory.spawn("a")
    fake = "00000000feedf00d"
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.ROUTING_ID, f"{fake}.0123456789abcdef".encode())
    raw.connect(a.router)

    async def scenario() -> None:
        async with Agent("worker", socket=a.socket) as worker:
            asked: list[Any] = []
            worker.on("think")(lambda msg: asked.append(msg.payload))
            hello = {"node": fake, "name": "old", "mesh": a.mesh, "proto": P.PROTOCOL_VERSION,
                     "incarnation": "1", "routers": [], "pubs": [], "reply": True,
                     "dir": {"version": 1, "agents": []}}
            raw.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "hello", "from": fake}),
                                msgpack.packb(hello)])
            await async_wait_until(lambda: a.peer_states().get(fake) == "online", what="the old peer greeted")
            raw.send_multipart(_old_batch("relayed", "worker", [
                [{"kind": "request", "id": "r1", "topic": "think"}, msgpack.packb("one")],
                [{"kind": "request", "id": "r2", "topic": "think"}, msgpack.packb("two")]]))
            await async_wait_until(lambda: len(asked) == 2, what="both relayed requests to be handled")
            assert sorted(asked) == ["one", "two"]

    try:
        asyncio.run(scenario())
    finally:
        raw.close(0)
        ctx.term()
    assert a.query("node")["stats"]["batches_without_kinds"] == 1


def test_another_protocol_version_is_told_both_versions(meshd_factory: MeshdFactory) -> None:
    """Policy §4.4, a version bump: a frame with another version byte is refused with an error
    that names both versions and the message it refuses, not dropped."""
    a = meshd_factory.spawn("a")
    ctx, raw = raw_agent(a.socket)

    async def scenario() -> None:
        await register_raw(raw, "future")
        other = P.SIGNATURE[:3] + bytes([P.PROTOCOL_VERSION + 1])
        raw.send_multipart([other, msgpack.packb({"kind": "request", "id": "v-next", "from": "future",
                                                  "to": "nobody", "topic": "t"}), msgpack.packb(None)])
        err = await asyncio.to_thread(recv_skipping_pings, raw)
        assert err["kind"] == "error" and err["error"]["code"] == "VALIDATION_FAILED", err
        assert err["corr"] == "v-next"
        message = err["error"]["message"]
        assert f"version {P.PROTOCOL_VERSION + 1}" in message and f"expected {P.PROTOCOL_VERSION}" in message

    try:
        asyncio.run(scenario())
    finally:
        raw.close(0)
        ctx.term()
