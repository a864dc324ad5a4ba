"""Header fields out of range are refused at the edge, on a real daemon.

A raw DEALER speaks the local protocol directly (the client library would never send these): a
request with ``hops = -1000000`` once slipped under the hop limit and could be delegated a million
times. Each bad field is answered with VALIDATION_FAILED naming the message's id, counted, kept as
a dead letter with its reason, never handed to the handler, and the daemon goes on serving.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest
import zmq

from meshd import Agent
from meshd.testing import MeshdFactory, async_wait_until, raw_agent, recv_skipping_pings, register_raw
from meshd.wire import protocol as P

BAD_FIELDS: list[tuple[str, Any]] = [
    ("hops", -1_000_000),
    ("hops", 2**40),
    ("hops", 1.5),
    ("qos", 2),
    ("qos", -1),
    ("deadline", float("inf")),
    ("deadline", float("nan")),
    ("deadline", -5.0),
    ("budget", -1),
    ("budget", float("inf")),
    ("budget", "5s"),
    ("to", 12345),
]





def _record_thinking(worker: Agent) -> list[Any]:
    """Give ``worker`` a "think" handler that answers "ok"; the payloads it ran for, in a list."""
    ran: list[Any] = []

    @worker.on("think")
    async def think(msg: Any) -> str:
        ran.append(msg.payload)
        return "ok"

    return ran


@pytest.mark.parametrize("key,value", BAD_FIELDS, ids=[f"{k}={v!r}" for k, v in BAD_FIELDS])
def test_out_of_range_header_field_is_refused(meshd_factory: MeshdFactory, key: str, value: Any) -> None:
    a = meshd_factory.spawn("a")
    ctx, raw = raw_agent(a.socket)

    async def scenario() -> None:
        async with Agent("worker", socket=a.socket) as worker:
            ran = _record_thinking(worker)
            await register_raw(raw, "hostile")
            header = {"kind": "request", "id": "bad-1", "from": "hostile", "to": "worker",
                      "topic": "think", "hops": 0}
            header[key] = value
            raw.send_multipart([P.SIGNATURE, msgpack.packb(header), msgpack.packb("bad")])
            err = await asyncio.to_thread(recv_skipping_pings, raw)
            assert err["kind"] == "error", err
            assert err["error"]["code"] == "VALIDATION_FAILED", err
            assert err["corr"] == "bad-1" and repr(key) in err["error"]["message"]

            # The daemon goes on: a well-formed request from the same connection is served.
            raw.send_multipart([P.SIGNATURE, msgpack.packb(
                {"kind": "request", "id": "good-1", "from": "hostile", "to": "worker", "topic": "think"}),
                msgpack.packb("good")])
            reply = await asyncio.to_thread(recv_skipping_pings, raw)
            assert reply["kind"] == "reply" and reply["corr"] == "good-1", reply
            assert ran == ["good"]  # the refused request never reached the handler

    try:
        asyncio.run(scenario())
    finally:
        raw.close(0)
        ctx.term()
    letters = a.dead_letters()
    bad = [d for d in letters if d["reason"] == "malformed:bad_field"]
    assert len(bad) == 1 and bad[0]["header"]["id"] == "bad-1", letters
    assert a.info()["stats"]["malformed_bad_field"] == 1


def test_a_request_inside_a_batch_is_held_to_the_same_ranges(meshd_factory: MeshdFactory) -> None:
    """A batch declaring requests whose inner request has hops = -1000000 is refused whole at the
    edge (VALIDATION_FAILED for each message, counted), like the single request above; a batch of
    in-range requests from the same connection is served."""
    a = meshd_factory.spawn("a")
    ctx, raw = raw_agent(a.socket)

    def batch(bid: str, inner_hops: list[int]) -> list[bytes]:
        items = [[{"kind": "request", "id": f"{bid}-{i}", "topic": "think", "hops": h},
                  msgpack.packb(i)] for i, h in enumerate(inner_hops)]
        header = {"kind": "batch", "id": bid, "from": "hostile", "to": "worker",
                  "count": len(items), "kinds": ["request"]}
        return [P.SIGNATURE, msgpack.packb(header), msgpack.packb(items)]

    async def scenario() -> None:
        async with Agent("worker", socket=a.socket) as worker:
            ran = _record_thinking(worker)
            await register_raw(raw, "hostile")
            raw.send_multipart(batch("bad", [0, -1_000_000]))
            refused = {(await asyncio.to_thread(recv_skipping_pings, raw))["corr"] for _ in range(2)}
            assert refused == {"bad-0", "bad-1"}, refused  # refused whole: one error per message
            raw.send_multipart(batch("good", [0, 1]))
            replies = [await asyncio.to_thread(recv_skipping_pings, raw) for _ in range(2)]
            assert {r["kind"] for r in replies} == {"reply"}, replies
            assert sorted(ran) == [0, 1], ran  # only the good batch reached the handler

    try:
        asyncio.run(scenario())
    finally:
        raw.close(0)
        ctx.term()
    assert a.info()["stats"]["malformed_bad_field"] == 1


def test_hop_limit_still_bounces_an_in_range_request(meshd_factory: MeshdFactory) -> None:
    """hops within the header's range but above hop_limit is still a HOP_LIMIT bounce (unchanged)."""
    a = meshd_factory.spawn("a")
    ctx, raw = raw_agent(a.socket)

    async def scenario() -> None:
        async with Agent("worker", socket=a.socket) as worker:
            worker.on("think")(lambda m: "ok")
            await register_raw(raw, "relay")
            raw.send_multipart([P.SIGNATURE, msgpack.packb(
                {"kind": "request", "id": "h1", "from": "relay", "to": "worker", "topic": "think",
                 "hops": 6}), b"\xc0"])
            err = await asyncio.to_thread(recv_skipping_pings, raw)
            assert err["kind"] == "error" and err["error"]["code"] == "HOP_LIMIT" and err["corr"] == "h1"

    try:
        asyncio.run(scenario())
    finally:
        raw.close(0)
        ctx.term()


def test_out_of_range_fields_from_a_peer_are_refused_at_the_mesh_edge(meshd_factory: MeshdFactory) -> None:
    """The mesh side: a greeted (plaintext, loopback) raw peer sends requests with
    hops = -1000000, hops = 2**40, qos 7 and a NaN deadline to a local agent: each is counted as
    malformed (bad_field) and dead-lettered, none reaches the handler, and a well-formed one from
    the same peer does."""
    a = meshd_factory.spawn("a")
    fake = "00000000deadbeef"
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.ROUTING_ID, f"{fake}.0123456789abcdef".encode())
    raw.connect(a.router)
    bad: list[tuple[str, Any]] = [("hops", -1_000_000), ("hops", 2**40), ("qos", 7),
                                  ("deadline", float("nan"))]

    async def scenario() -> None:
        async with Agent("worker", socket=a.socket) as worker:
            ran: list[Any] = []
            worker.on("think")(lambda m: ran.append(m.payload))
            hello = {"node": fake, "name": "raw", "mesh": a.mesh, "proto": P.PROTOCOL_VERSION,
                     "incarnation": "1", "routers": [], "pubs": [], "reply": True,
                     "dir": {"version": 1, "agents": []}}
            raw.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "hello", "from": fake}),
                                msgpack.packb(hello)])
            await async_wait_until(lambda: a.peer_states().get(fake) == "online", what="the raw peer greeted")
            for n, (key, value) in enumerate(bad):
                header = {"kind": "send", "id": f"bad-{n}", "from": "x", "to": "worker", "topic": "think",
                          key: value}
                raw.send_multipart([P.SIGNATURE, msgpack.packb(header), msgpack.packb("bad")])
            raw.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "send", "id": "good", "from": "x",
                                                            "to": "worker", "topic": "think"}),
                                msgpack.packb("good")])
            await async_wait_until(lambda: ran, what="the good send")
            assert ran == ["good"]

    try:
        asyncio.run(scenario())
    finally:
        raw.close(0)
        ctx.term()
    stats = a.query("node")["stats"]
    assert stats.get("malformed_bad_field") == len(bad), stats
    ids = {d["header"]["id"] for d in a.dead_letters() if d["reason"] == "malformed:bad_field"}
    assert ids == {f"bad-{n}" for n in range(len(bad))}
