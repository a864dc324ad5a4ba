"""The in-process agent connection of the embedded node (meshd/daemon/embedded.py) keeps the ROUTER's
contract: Again when full, EHOSTUNREACH when gone, delivery never re-entrant, bounded per turn.
A real asyncio loop, no sockets: the ipc ROUTER it falls back to is a recorder here."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import zmq

from meshd import transport
from meshd.daemon.embedded import DELIVER_BUDGET, ROUTE_BUDGET, AgentSockets, _Reactor
from meshd.errors import DaemonUnreachable


class RecordingRouter:
    """Stands in for the ipc ROUTER: what AgentSockets passes on for ids it does not own."""

    closed = False

    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []

    def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
        self.sent.append(frames)


def make(loop: asyncio.AbstractEventLoop, capacity: int = 4) -> tuple[AgentSockets, RecordingRouter,
                                                                      list[list[bytes]]]:
    router = RecordingRouter()
    sockets = AgentSockets(router, capacity=capacity, loop=loop)  # type: ignore[arg-type]
    routed: list[list[bytes]] = []
    sockets.on_agent = routed.append
    return sockets, router, routed


async def turn() -> None:
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def test_frames_reach_the_agent_on_a_later_turn_in_order_and_full_means_again() -> None:
    async def run() -> None:
        sockets, router, _ = make(asyncio.get_running_loop(), capacity=3)
        got: list[list[bytes]] = []
        conn = sockets.attach(got.append)
        for n in range(3):
            sockets.send_multipart([conn.rid, b"sig", b"h", str(n).encode()])
        assert got == []  # never inside the node's call: like a socket, on a later turn
        with pytest.raises(zmq.Again):
            sockets.send_multipart([conn.rid, b"sig", b"h", b"3"])  # full: INBOX_FULL for the node
        await turn()
        assert [f[2] for f in got] == [b"0", b"1", b"2"] and len(conn) == 0
        sockets.send_multipart([conn.rid, b"sig", b"h", b"4"])  # room again
        sockets.send_multipart([b"\x00abcd", b"sig", b"h", b"ipc"])  # not ours: the ipc ROUTER's
        assert router.sent == [[b"\x00abcd", b"sig", b"h", b"ipc"]]
    asyncio.run(run())


def test_a_gone_connection_is_unreachable_not_full() -> None:
    async def run() -> None:
        sockets, _, _ = make(asyncio.get_running_loop())
        detached: list[int] = []
        sockets.on_detached = lambda: detached.append(1)
        conn = sockets.attach(lambda frames: None)
        conn.close()
        assert detached == [1] and conn.rid not in sockets
        # the node's view: the id now goes to the ROUTER, which (MANDATORY) reports it unroutable
        with pytest.raises(zmq.ZMQError) as err:
            conn.put([b"sig", b"h", b""])
        assert not isinstance(err.value, zmq.Again) and err.value.errno == zmq.EHOSTUNREACH
        with pytest.raises(DaemonUnreachable):
            conn.send_multipart([b"sig", b"h", b""])
    asyncio.run(run())


def test_the_agent_hands_the_node_a_bounded_number_of_frame_sets_per_turn() -> None:
    async def run() -> None:
        sockets, _, routed = make(asyncio.get_running_loop())
        conn = sockets.attach(lambda frames: None)
        for n in range(ROUTE_BUDGET):
            conn.send_multipart([b"sig", b"h", str(n).encode()])
        assert len(routed) == ROUTE_BUDGET and routed[0][0] == conn.rid  # the node sees our id first
        with pytest.raises(zmq.Again):  # the client's SendQueue keeps it and yields
            conn.send_multipart([b"sig", b"h", b"more"])
        await turn()
        conn.send_multipart([b"sig", b"h", b"more"])
        assert routed[-1][-1] == b"more"
    asyncio.run(run())


def test_delivery_is_bounded_per_turn_and_a_raising_handler_loses_only_its_frame_set() -> None:
    async def run() -> None:
        sockets, _, _ = make(asyncio.get_running_loop(), capacity=10_000)
        got: list[Any] = []

        def on_frames(frames: list[bytes]) -> None:
            if frames[2] == b"bad":
                raise ValueError("handler bug")
            got.append(frames[2])

        conn = sockets.attach(on_frames)
        conn.put([b"sig", b"h", b"bad"])
        for n in range(DELIVER_BUDGET + 10):
            conn.put([b"sig", b"h", str(n).encode()])
        await asyncio.sleep(0)
        assert len(got) == DELIVER_BUDGET - 1  # the rest waits for the next turn
        await turn()
        assert len(got) == DELIVER_BUDGET + 10 and got[-1] == str(DELIVER_BUDGET + 9).encode()
    asyncio.run(run())


def test_after_the_node_stops_an_agent_send_is_refused_and_nothing_routes() -> None:
    async def run() -> None:
        sockets, _, routed = make(asyncio.get_running_loop())
        conn = sockets.attach(lambda frames: None)
        sockets.close()
        with pytest.raises(DaemonUnreachable):  # typed, as the client's calls raise it
            conn.send_multipart([b"sig", b"h", b""])
        assert routed == [] and len(sockets) == 0
    asyncio.run(run())



def test_a_full_peer_queue_makes_the_agent_wait_instead_of_being_refused() -> None:
    """When a peer's DEALER is at its high-water mark the node would refuse what the agent routes
    (PEER_UNREACHABLE); the in-process connection says Again at the start of the turn instead, as
    a full DEALER makes its sender wait, and lets frames through once the peer has room."""
    async def run() -> None:
        sockets, _, routed = make(asyncio.get_running_loop())
        full = [True]
        sockets.peers_full = lambda: full[0]
        conn = sockets.attach(lambda frames: None)
        with pytest.raises(zmq.Again):
            conn.send_multipart([b"sig", b"h", b"0"])
        assert routed == [] and sockets.stats["embedded_peer_waits"] == 1
        full[0] = False
        conn.send_multipart([b"sig", b"h", b"1"])
        assert [f[-1] for f in routed] == [b"1"]
    asyncio.run(run())


def test_a_reply_from_the_node_is_handed_over_at_once_unless_something_comes_first() -> None:
    async def run() -> None:
        sockets, _, _ = make(asyncio.get_running_loop(), capacity=4)
        got: list[list[bytes]] = []
        conn = sockets.attach(got.append)
        assert sockets.hand_over([conn.rid, b"sig", b"reply", b"0"])  # the node's own event: at once
        assert got == [[b"sig", b"reply", b"0"]]
        sockets.send_multipart([conn.rid, b"sig", b"h", b"1"])  # queued for the next turn
        assert not sockets.hand_over([conn.rid, b"sig", b"reply", b"2"])  # would overtake "1": no
        await turn()
        conn.pause()  # the agent does not read: nothing handed over
        assert not sockets.hand_over([conn.rid, b"sig", b"reply", b"3"])
        conn.resume()
        seen: list[bool] = []
        sockets.on_agent = lambda frames: seen.append(sockets.hand_over([conn.rid, b"sig", b"reply", b"4"]))
        conn.send_multipart([b"sig", b"h", b"5"])  # inside the agent's own call into the node: no
        assert seen == [False]
        assert not sockets.hand_over([b"\x00abcd", b"sig", b"reply", b"6"])  # not ours: usual path
        assert [f[2] for f in got] == [b"0", b"1"]
    asyncio.run(run())


def test_the_node_rechecks_the_ipc_router_only_after_sending_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kick re-checks a socket's read edge after a send on it; frame sets handed to in-process
    connections never touched the ROUTER, so they cost no re-check (a loop callback each)."""
    async def run() -> None:
        loop = asyncio.get_running_loop()
        sockets, router, _ = make(loop)
        reactor = _Reactor(loop, sockets=lambda: sockets)
        kicked: list[Any] = []
        monkeypatch.setattr(transport.Reactor, "kick", lambda self, sock: kicked.append(sock))
        conn = sockets.attach(lambda frames: None)
        sockets.send_multipart([conn.rid, b"sig", b"h", b"in-process"])
        reactor.kick(sockets)  # type: ignore[arg-type]
        assert kicked == []
        sockets.send_multipart([b"\x00abcd", b"sig", b"h", b"ipc"])
        reactor.kick(sockets)  # type: ignore[arg-type]
        reactor.kick(sockets)  # type: ignore[arg-type]  # nothing sent on it since the last one
        assert kicked == [router]
    asyncio.run(run())


def test_once_connected_frames_from_the_node_reach_the_agent_at_the_end_of_its_drain() -> None:
    """Before ``connect`` returned (handlers may not be registered yet) and inside an agent's own
    call into the node, frame sets wait for a later loop turn; after it, what the node queues in
    its own events goes to the reactor's end-of-drain list (``Reactor.soon``), never re-entrant."""
    async def run() -> None:
        sockets, _, _ = make(asyncio.get_running_loop(), capacity=8)
        at_drain_end: list[Any] = []
        sockets.soon = at_drain_end.append
        got: list[bytes] = []
        conn = sockets.attach(lambda frames: got.append(frames[2]))
        sockets.send_multipart([conn.rid, b"sig", b"h", b"0"])  # not connected yet: next turn
        assert at_drain_end == [] and got == []
        await turn()
        assert got == [b"0"]
        conn.connected = True
        sockets.on_agent = lambda frames: sockets.send_multipart([conn.rid, b"sig", b"h", b"1"])
        conn.send_multipart([b"sig", b"h", b"x"])  # an agent's call on the stack: next turn
        assert at_drain_end == [] and got == [b"0"]
        await turn()
        assert got == [b"0", b"1"]
        sockets.send_multipart([conn.rid, b"sig", b"h", b"2"])  # the node's own event
        sockets.send_multipart([conn.rid, b"sig", b"h", b"3"])
        assert got == [b"0", b"1"] and len(at_drain_end) == 1  # once, not inside the node's call
        at_drain_end.pop()()
        assert got == [b"0", b"1", b"2", b"3"]
    asyncio.run(run())
