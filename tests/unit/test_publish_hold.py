"""PublicationHold (meshd/delivery/publication_hold.py): bounded per subscriber and in bytes, in order,
answers
first, and what waits for a connection that is gone is forgotten. A real ROUTER -> DEALER pair over
inproc stands for the agent socket, its high-water marks for a full inbox."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import zmq

from meshd.delivery.local_agents import AgentLink
from meshd.delivery.publication_hold import HOLD_FLUSH_MAX_S, HOLD_FLUSH_S, PublicationHold
from meshd.transport import Reactor
from meshd.wire import protocol as P

Pair = tuple[zmq.Socket[Any], zmq.Socket[Any]]


@pytest.fixture
def pair(inproc_pair: Callable[[bytes], Pair]) -> Pair:
    return inproc_pair(b"sub")


def _publication(i: int) -> list[bytes]:
    return [P.SIGNATURE, P.pack({P.KIND: "publish", P.ID: str(i), P.TOPIC: "t"}), b"%d" % i]


def _fill(router: zmq.Socket[Any]) -> int:
    """Send until the inbox is full; how many went."""
    sent = 0
    while True:
        try:
            router.send_multipart([b"sub", *_publication(-1)], zmq.NOBLOCK)
        except zmq.Again:
            return sent
        sent += 1


def _drain(dealer: zmq.Socket[Any]) -> list[bytes]:
    payloads = []
    while dealer.poll(50):
        payloads.append(dealer.recv_multipart()[2])
    return payloads


def test_held_publications_go_out_in_order_once_the_subscriber_reads(
        pair: tuple[zmq.Socket[Any], zmq.Socket[Any]]) -> None:
    router, dealer = pair
    loop = asyncio.new_event_loop()
    try:
        link = AgentLink(router, Reactor(loop), "node")
        stats: Counter[str] = Counter()
        hold = PublicationHold(link, stats, per_subscriber_max=5, max_bytes=1 << 20,
                               connected=lambda rid: rid == b"sub")
        filled = _fill(router)
        assert filled > 0
        for i in range(5):
            assert hold.offer(b"sub", _publication(i), 1)
        assert not hold.offer(b"sub", _publication(5), 1), "past publish_hold_max: the caller drops it"
        assert hold.waiting(b"sub") == 5 and stats["publish_hold_peak"] == 5
        assert not hold.flush_one(b"sub"), "the inbox is still full"
        received = _drain(dealer)  # the subscriber reads; the hold fills its inbox again as it goes
        while hold.waiting(b"sub"):
            hold.flush_one(b"sub")
            received += _drain(dealer)
        assert received[filled:] == [b"0", b"1", b"2", b"3", b"4"], "in order, after what was queued"
        assert stats["publish_held"] == stats["publish_hold_delivered"] == 5
        assert hold.bytes == 0
    finally:
        loop.close()


def test_answers_go_before_held_publications_and_the_byte_bound_holds(
        pair: tuple[zmq.Socket[Any], zmq.Socket[Any]]) -> None:
    router, dealer = pair
    loop = asyncio.new_event_loop()
    try:
        link = AgentLink(router, Reactor(loop), "node")
        size = sum(map(len, _publication(0)))
        hold = PublicationHold(link, Counter(), per_subscriber_max=100, max_bytes=2 * size,
                               connected=lambda rid: True)
        _fill(router)
        assert hold.offer(b"sub", _publication(0), 1) and hold.offer(b"sub", _publication(1), 1)
        assert not hold.offer(b"sub", _publication(2), 1), "past publish_hold_max_bytes"
        assert link.send_answer([b"sub", *P.frames({P.KIND: "ok", P.CORR: "x"})])  # waits: inbox full
        assert link.has_backlog(b"sub")
        assert not hold.flush_one(b"sub"), "an answer waits for that connection: it goes first"
        received: list[bytes] = []
        while link.has_backlog(b"sub") or hold.waiting(b"sub"):
            received += _drain(dealer)
            link.flush_backlog()
            hold.flush_one(b"sub")
        received += _drain(dealer)
        assert [r for r in received if r != b"-1"] == [b"", b"0", b"1"], "the answer, then the held ones"
    finally:
        loop.close()


def test_what_waits_for_a_connection_that_left_is_forgotten_and_counted(
        pair: tuple[zmq.Socket[Any], zmq.Socket[Any]]) -> None:
    router, _ = pair
    loop = asyncio.new_event_loop()
    try:
        link = AgentLink(router, Reactor(loop), "node")
        stats: Counter[str] = Counter()
        present = {b"sub"}
        hold = PublicationHold(link, stats, per_subscriber_max=100, max_bytes=1 << 20,
                               connected=lambda rid: rid in present)
        _fill(router)
        assert hold.offer(b"sub", _publication(0), 3)  # a publishing batch of 3
        present.clear()
        hold.flush()
        assert hold.waiting(b"sub") == 0 and hold.bytes == 0
        assert stats["publish_hold_discarded"] == 3
    finally:
        loop.close()


def test_a_hold_nobody_reads_is_looked_at_less_often_and_soon_again_once_one_reads(
        pair: tuple[zmq.Socket[Any], zmq.Socket[Any]]) -> None:
    router, dealer = pair

    async def scenario() -> None:
        link = AgentLink(router, Reactor(asyncio.get_running_loop()), "node")
        hold = PublicationHold(link, Counter(), per_subscriber_max=100, max_bytes=1 << 20,
                               connected=lambda rid: True)
        _fill(router)
        assert hold.offer(b"sub", _publication(0), 1)
        for _ in range(10):  # nothing goes out: each round doubles the wait, up to the bound
            hold.flush()
        assert hold._interval == HOLD_FLUSH_MAX_S
        _drain(dealer)
        hold.flush()  # the subscriber read: the held one goes out, and the next look is soon
        assert hold.waiting(b"sub") == 0 and hold._interval == HOLD_FLUSH_S

    asyncio.run(scenario())


def test_the_publishers_of_a_reading_subscriber_are_known_and_not_those_of_one_that_stopped(
        pair: tuple[zmq.Socket[Any], zmq.Socket[Any]]) -> None:
    router, _ = pair
    loop = asyncio.new_event_loop()
    try:
        link = AgentLink(router, Reactor(loop), "node")
        hold = PublicationHold(link, Counter(), per_subscriber_max=100, max_bytes=1 << 20,
                               connected=lambda rid: True)
        _fill(router)
        assert hold.offer(b"sub", _publication(0), 3, "pub-a")
        assert hold.offer(b"sub", _publication(1), 1, "pub-b")
        assert hold.held_from("pub-a") == 3 and hold.held_from("pub-b") == 1
        assert hold.reading_publishers(60.0) == {"pub-a", "pub-b"}, "the hold began just now"
        # A subscriber whose hold neither began nor sent one out within the window holds nobody up.
        assert hold.reading_publishers(-1.0) == set()
    finally:
        loop.close()
