"""AgentLink's answer lane (meshd/delivery/local_agents.py): answers to calls and notices (errors that answer
nothing the client awaits) wait in rooms of their own, so a flood of notices caused by
fire-and-forget sends never crowds out the answer to a call. A real ROUTER -> DEALER pair over
inproc stands for the agent socket, its high-water marks for a full inbox."""

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

ROOM = 5


Pair = tuple[zmq.Socket[Any], zmq.Socket[Any]]


@pytest.fixture
def pair(inproc_pair: Callable[[bytes], Pair]) -> Pair:
    return inproc_pair(b"agent")


def _notice(i: int) -> dict[str, Any]:
    return P.error_header("agent", f"send-{i}", P.ErrorCode.INBOX_FULL, "full", retry=True,
                          retry_after=0.1, sender="meshd@n", notice=True)


def _answer(i: int) -> dict[str, Any]:
    return {P.KIND: P.Kind.OK, P.CORR: f"call-{i}"}


def test_notices_past_their_room_are_dropped_but_never_take_the_room_of_answers(
        pair: tuple[zmq.Socket[Any], zmq.Socket[Any]]) -> None:
    router, dealer = pair
    loop = asyncio.new_event_loop()
    try:
        stats: Counter[str] = Counter()
        link = AgentLink(router, Reactor(loop), "n", backlog_max=ROOM, stats=stats)
        # Fill the inbox, then the notice room, and then some: the extra notices are dropped.
        sent_at_once = 0
        while link.send(b"agent", _notice(sent_at_once)) and not link.has_backlog(b"agent"):
            sent_at_once += 1
        for i in range(3 * ROOM):
            link.send(b"agent", _notice(1000 + i))
        assert stats["notices_dropped"] > 0, "notices past their room are dropped..."
        assert stats["answers_dropped"] == 0
        # ...and every answer to a call still fits, in its own room.
        assert all(link.send(b"agent", _answer(i)) for i in range(ROOM))
        assert not link.send(b"agent", _answer(ROOM)), "answers have a bound too"
        assert stats["answers_dropped"] == 1
        # The agent reads: the held ones come out, oldest first, all answers among them.
        corrs: list[str] = []
        while link.has_backlog(b"agent") or dealer.poll(20):
            link.flush_backlog()
            while dealer.poll(20):
                corrs.append(P.unpack_header(dealer.recv_multipart()[1])[P.CORR])
        assert [c for c in corrs if c.startswith("call-")] == [f"call-{i}" for i in range(ROOM)]
        notices = [c for c in corrs if c.startswith("send-1")]
        assert notices == sorted(notices, key=lambda c: int(c[5:])) and len(notices) <= ROOM
        assert P.is_notice(_notice(0)) and not P.is_notice(_answer(0))
    finally:
        loop.close()
