"""AgentLink's credit mode (meshd/delivery/local_agents.py, docs/PROTOCOL.md §8.11): data held in the
daemon for an agent goes out when the agent grants credit, and also when the agent's pipe frees
room while its window had room all along (a pipe full of publications, answers or notices, which
take no credit, brings no grant). A real ROUTER -> DEALER pair over inproc with high-water marks
of 2 stands for the agent socket."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import zmq

from meshd.delivery.local_agents import AgentLink
from meshd.transport import Reactor
from meshd.wire import protocol as P

Pair = tuple[zmq.Socket[Any], zmq.Socket[Any]]
RID = b"agent"


def _publication(i: int) -> list[bytes]:
    return [RID, *P.frames({P.KIND: P.Kind.PUBLISH, P.ID: f"pub-{i}", P.TOPIC: "t", P.FROM: "x"})]


def _send(i: int) -> list[bytes]:
    return [RID, *P.frames({P.KIND: P.Kind.SEND, P.ID: f"send-{i}", P.TO: "agent", P.FROM: "x",
                            P.TOPIC: "t"})]


def _read_all(dealer: zmq.Socket[Any]) -> list[str]:
    ids = []
    while dealer.poll(0):
        ids.append(str(P.unpack_header(dealer.recv_multipart()[1])[P.ID]))
    return ids


async def _drain_until(dealer: zmq.Socket[Any], want: str, seconds: float = 5.0) -> list[str]:
    """Read what arrives (granting nothing) until ``want`` came, letting the loop's timers run."""
    got: list[str] = []
    deadline = asyncio.get_running_loop().time() + seconds
    while want not in got and asyncio.get_running_loop().time() < deadline:
        got += _read_all(dealer)
        await asyncio.sleep(0.002)
    return got


def test_data_held_behind_a_pipe_of_publications_goes_out_without_a_grant(
        inproc_pair: Callable[[bytes], Pair]) -> None:
    router, dealer = inproc_pair(RID)

    async def scenario() -> None:
        stats: Counter[str] = Counter()
        link = AgentLink(router, Reactor(asyncio.get_running_loop()), "n", held_max=10, stats=stats)
        link.open_credit(RID, 32)
        published = 0
        try:  # publications take no credit and go straight into the pipe, until it is full
            while published < 100:
                link.send_now(_publication(published))
                published += 1
        except zmq.Again:
            pass
        assert 0 < published < 100, "the pipe fills (high-water marks of 2)"
        assert link.send_data(_send(0), P.DEFAULT_PRIORITY), "the window has room: taken (held)"
        assert stats["credit_held"] == 1, "the full pipe refused it: it waits in the daemon"
        # The agent reads the publications and grants nothing (they took no credit): the send
        # still arrives, once the pipe has room.
        got = await _drain_until(dealer, "send-0")
        assert "send-0" in got, f"held data stalled with room in the window: {got}"
        assert stats["credit_delivered"] == 1

    asyncio.run(scenario())


def test_a_grant_that_says_nothing_new_still_sends_what_waits(inproc_pair: Callable[[bytes], Pair]) -> None:
    """A heartbeat's ``credit_read`` is a resync: it re-sends held data even if the count is not
    new (the window had room, the pipe had not, and no timer was running)."""
    router, dealer = inproc_pair(RID)
    stats: Counter[str] = Counter()
    # no event loop runs: a flush timer cannot be scheduled, only a grant can send what waits
    loop = asyncio.new_event_loop()
    link = AgentLink(router, Reactor(loop), "n", held_max=10, stats=stats)
    link.open_credit(RID, 32)
    sent = 0
    while stats["credit_held"] == 0 and sent < 100:
        assert link.send_data(_send(sent), P.DEFAULT_PRIORITY)
        sent += 1
    assert stats["credit_held"] == 1, "the pipe filled before the window (32)"
    first = _read_all(dealer)
    assert f"send-{sent - 1}" not in first
    router.getsockopt(zmq.EVENTS)  # the ROUTER learns the pipe has room (as the reactor's checks do)
    link.granted(RID, 0)  # nothing read that counts (the agent says 0 still)
    assert f"send-{sent - 1}" in first + _read_all(dealer)
    assert stats["credit_delivered"] == 1
    loop.close()


def test_a_batch_the_agent_drops_as_malformed_still_counts_the_credit_it_took() -> None:
    """The daemon counted the batch header's ``count`` (it checks only the outer header): if the
    client drops the frame set (here an undecodable body), the credit is counted all the same,
    else each such batch shrinks the window for good, down to a stall."""
    from meshd.client.batching import credit_of, split_incoming_counted
    from meshd.wire.protocol import FrameError

    header = {P.KIND: P.Kind.BATCH, P.ID: "b1", P.FROM: "x", P.TO: "agent", P.COUNT: 7,
              P.KINDS: [P.Kind.SEND]}
    frames = P.frames(header, b"\xc1 not msgpack")
    with pytest.raises(FrameError):
        split_incoming_counted(frames)
    assert credit_of(frames) == 7
    assert credit_of([P.SIGNATURE, b"\xc1"]) == 0  # no header to count from: nothing
