"""A fresh DEALER greets before it sends anything else.

A daemon drops what a routing id sends before that routing id's HELLO (docs/PROTOCOL.md). When a
peer's HELLO advertises another endpoint than the one we dialled, the daemon re-dials it with a new
DEALER (a new routing id) and, if that HELLO was a reply, at once sends a heartbeat on it; requests
its agents send next go the same way. The HELLO used to be sent only once the handshake event was
seen, behind whatever had been queued: the peer dropped the first frames of the new link (under
load, a request on a fresh link was lost although heartbeats kept arriving). Here a hand-written
peer advertises a second endpoint and reads the first frame the daemon's new DEALER sends there.
"""

from __future__ import annotations

import asyncio

import msgpack
import zmq

from meshd.testing import MeshdFactory, async_wait_until
from meshd.wire import protocol as P

FAKE = "00000000f00dface"


def _hello(mesh: str, router: str, reply: bool) -> list[bytes]:
    body = {"node": FAKE, "name": "fake", "mesh": mesh, "proto": P.PROTOCOL_VERSION,
            "incarnation": "1", "routers": [router], "pubs": [], "reply": reply,
            "dir": {"version": 1, "agents": []}}
    return [P.SIGNATURE, msgpack.packb({"kind": "hello", "from": FAKE}), msgpack.packb(body)]


def _bound_router(ctx: zmq.Context[zmq.Socket[bytes]]) -> tuple[zmq.Socket[bytes], str]:
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:0")
    return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)


def _first_frames(sock: zmq.Socket[bytes]) -> list[bytes]:
    """The first mesh frame that arrives at ``sock`` (routing id stripped), within 20 s."""
    if not sock.poll(20_000):
        raise AssertionError("the daemon never dialled the advertised endpoint")
    return sock.recv_multipart()[1:]


def test_a_redial_greets_before_its_first_heartbeat(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    first, first_ep = _bound_router(ctx)
    second, second_ep = _bound_router(ctx)
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.ROUTING_ID, f"{FAKE}.0123456789abcdef".encode())
    raw.connect(a.router)

    async def scenario() -> None:
        raw.send_multipart(_hello(a.mesh, first_ep, reply=False))
        frames = await asyncio.to_thread(_first_frames, first)
        assert msgpack.unpackb(frames[1])["kind"] == "hello", frames
        await async_wait_until(lambda: a.peer_states().get(FAKE) is not None, what="the fake peer known")
        # The peer moved: its HELLO reply advertises the second endpoint. The daemon re-dials it
        # and answers the reply with a heartbeat on the new DEALER.
        raw.send_multipart(_hello(a.mesh, second_ep, reply=True))
        frames = await asyncio.to_thread(_first_frames, second)
        kind = msgpack.unpackb(frames[1])["kind"]
        assert kind == "hello", f"the new DEALER's first frame was a {kind!r}, not its HELLO"

    try:
        asyncio.run(scenario())
    finally:
        for sock in (raw, first, second):
            sock.close(0)
        ctx.term()
