"""docs/PROTOCOL.md §4.1 on the mesh side: a message has exactly three
frames, from a peer too. A greeted raw peer (plaintext, loopback) sends a ``send`` with a fourth
frame, a heartbeat with five and a batch with a second body frame, on its DEALER, and a
publication with an extra frame on its XPUB: each is dropped and counted, none reaches the agent,
and well-formed ones from the same peer do. Before, a routed single message or a publication with
extra frames was handed to the agent as it came (the Python client ignored the extra frames;
another client need not)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import zmq

from meshd import Agent
from meshd.testing import MeshdFactory, async_wait_until
from meshd.wire import protocol as P


def test_a_peer_message_with_the_wrong_frame_count_is_dropped(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    fake = "00000000feedf00d"
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.ROUTING_ID, f"{fake}.0123456789abcdef".encode())
    raw.connect(a.router)
    xpub = ctx.socket(zmq.XPUB)
    xpub.setsockopt(zmq.LINGER, 0)
    pub_port = xpub.bind_to_random_port("tcp://127.0.0.1")

    def send(header: dict[str, Any], *rest: bytes) -> None:
        raw.send_multipart([P.SIGNATURE, msgpack.packb({"from": "x", "to": "worker", "topic": "t", **header}),
                            *rest])

    async def scenario() -> None:
        async with Agent("worker", socket=a.socket) as worker:
            got: list[Any] = []
            worker.on("t")(lambda m: got.append(m.payload))
            worker.on("news")(lambda m: got.append(m.payload))
            await worker.subscribe("news")
            hello = {"node": fake, "name": "raw", "mesh": a.mesh, "proto": P.PROTOCOL_VERSION,
                     "incarnation": "1", "routers": [], "pubs": [f"tcp://127.0.0.1:{pub_port}"],
                     "reply": True, "dir": {"version": 1, "agents": []}}
            raw.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "hello", "from": fake}),
                                msgpack.packb(hello)])
            await async_wait_until(lambda: a.peer_states().get(fake) == "online", what="the raw peer greeted")
            send({"kind": "send", "id": "four"}, msgpack.packb("four frames"), b"extra")
            raw.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "hb", "from": fake, "ver": 1}),
                                b"", b"", b""])
            body = msgpack.packb([[{"kind": "send", "id": "in-batch"}, msgpack.packb("batched")]])
            send({"kind": "batch", "id": "b", "count": 1}, body, body)
            send({"kind": "send", "id": "good"}, msgpack.packb("good"))
            await async_wait_until(lambda: "good" in got, what="the well-formed send")

            await async_wait_until(lambda: xpub.poll(0) and xpub.recv() == b"\x01news\x00",
                                   what="the daemon's SUB to subscribe to the topic")
            publication = [P.topic_key("news"), P.SIGNATURE,
                           msgpack.packb({"kind": "publish", "id": "p", "from": "x", "topic": "news"})]
            xpub.send_multipart([*publication, msgpack.packb("published, extra frame"), b"extra"])
            xpub.send_multipart([*publication, msgpack.packb("published")])
            await async_wait_until(lambda: "published" in got, what="the well-formed publication")
            assert got == ["good", "published"]

    try:
        asyncio.run(scenario())
    finally:
        raw.close(0)
        xpub.close(0)
        ctx.term()
    stats = a.query("node")["stats"]
    assert stats.get("malformed_too_many_frames") == 2, stats
    assert stats.get("malformed_batch_odd_frames") == 1, stats
    assert stats.get("topic_dropped", 0) >= 1, stats
    reasons = {d["header"]["id"] for d in a.dead_letters() if d["reason"] == "malformed:too_many_frames"
               and d["header"] and "id" in d["header"]}
    assert reasons == {"four"}
    assert "Traceback" not in a.log()
