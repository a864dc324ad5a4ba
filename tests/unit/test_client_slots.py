"""The client's two bounds alone (no sockets): ``CallSlots`` (calls awaiting an answer, in order)
and ``HandlerSlots`` (handlers running at once, parked work, pausing the read, refusals), with a
real ``Dispatcher`` whose outgoing side is recorded in lists."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest

from meshd.client.batching import BatchKey
from meshd.client.call_slots import CallSlots
from meshd.client.handler_slots import HandlerSlots
from meshd.client.handlers import EARLY_CANCELS_MAX, Dispatcher
from meshd.errors import DaemonUnreachable, ValidationFailed
from meshd.transport import AGENT_RCVHWM
from meshd.wire import protocol as P
from meshd.wire.payloads import encode_payload
from meshd.wire.protocol import ErrorCode, Kind

# ---------------------------------------------------------------------------- CallSlots


def test_calls_past_the_allowance_wait_and_go_in_the_order_they_came() -> None:
    async def scenario() -> list[int]:
        slots = CallSlots(size=2)
        order: list[int] = []

        async def call(i: int) -> None:
            await slots.wait(5, TimeoutError())
            order.append(i)
            await asyncio.sleep(0.01)
            slots.give_back()

        await asyncio.gather(*(call(i) for i in range(8)))
        assert slots.peak == 2 and slots.used == 0
        return order

    assert asyncio.run(scenario()) == list(range(8))


def test_a_waiting_call_that_gives_up_or_is_cancelled_keeps_no_slot() -> None:
    async def scenario() -> None:
        slots = CallSlots(size=1)
        assert slots.try_take()
        assert await slots.take(0.01) is False  # timed out: no slot taken
        waiter = asyncio.ensure_future(slots.take(5))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        slots.give_back()
        assert slots.used == 0 and slots.try_take(), "the cancelled waiter did not keep the slot"

    asyncio.run(scenario())


def test_the_allowance_follows_the_daemon_and_close_fails_the_waiters() -> None:
    async def scenario() -> None:
        slots = CallSlots()  # before the register answer: unbounded
        assert all(slots.try_take() for _ in range(50))
        slots.fit_daemon(16, 8)
        assert slots.size == 8 and not slots.try_take()
        waiter = asyncio.ensure_future(slots.take(5))
        await asyncio.sleep(0)
        assert slots.waiting == 1
        slots.fail_waiting(DaemonUnreachable("agent closed"))
        with pytest.raises(DaemonUnreachable):
            await waiter

    asyncio.run(scenario())


# ---------------------------------------------------------------------------- HandlerSlots


class Harness:
    def __init__(self, limit: int, awaiting: bool = False) -> None:
        self.out: list[tuple[BatchKey, dict[str, Any], bytes]] = []
        self.pushed: list[list[bytes]] = []
        self.reading: list[bool] = []
        self.awaiting = awaiting
        # Wired as the Agent wires them: the slots first (they reach the dispatcher and the calls,
        # built after them, through closures), then the calls and the dispatcher with the slots'
        # bound methods.
        self.slots = HandlerSlots("me", limit, dispatch=lambda h, p, u: self.d.dispatch(h, p, u),
                                  push=self.pushed.append,
                                  enqueue=lambda k, h, p: self.out.append((k, h, p)),
                                  reading=self.reading.append,
                                  awaiting=lambda: bool(self.calls.used) or self.awaiting)
        self.calls = CallSlots(on_busy_change=self.slots.check_reading)
        self.d = Dispatcher("me", enqueue=lambda k, h, p: self.out.append((k, h, p)),
                            push=self.pushed.append, encode=encode_payload,
                            schedule=lambda fn: fn(), closed=lambda: False,
                            on_handler_task=self.slots.handler_started)

    def deliver(self, kind: str = Kind.REQUEST, payload: Any = None, unit: str | None = None) -> str:
        msg_id = P.new_id()
        header = {P.KIND: kind, P.ID: msg_id, P.TOPIC: "t", P.FROM: "asker", P.TO: "me"}
        self.slots.offer(header, encode_payload(payload), unit)
        return msg_id


def test_only_suspended_handlers_hold_slots_and_the_socket_pauses_when_all_are_taken() -> None:
    async def scenario() -> None:
        h = Harness(limit=2)
        h.slots.fit_daemon(3)  # it reads on until this much work waits here, then pauses
        release = asyncio.Event()
        started: list[int] = []

        async def handler(msg: Any) -> Any:
            if msg.payload == "quick":
                return "done"  # never suspends: no slot
            started.append(msg.payload)
            await release.wait()
            return msg.payload

        h.d.handlers["t"] = handler
        for _ in range(5):
            h.deliver(payload="quick")
        assert h.slots.running == 0 and h.reading == []
        for i in range(5):
            h.deliver(payload=i)
        assert started == [0, 1] and h.slots.running == 2
        assert h.reading == [False], "paused once every slot was taken and park_max work waited"
        assert len(h.slots.parked) == 3
        release.set()
        for _ in range(10):
            await asyncio.sleep(0)
        assert started == [0, 1, 2, 3, 4], "parked work ran first, in arrival order"
        assert h.reading == [False, True] and not h.slots.parked
        replies = [msgpack.unpackb(p) for _, hd, p in h.out if hd[P.KIND] == Kind.REPLY]
        assert sorted(r for r in replies if r != "done") == [0, 1, 2, 3, 4]

    asyncio.run(scenario())


def test_while_answers_are_awaited_it_reads_on_and_refuses_work_past_the_daemons_inbox_cap() -> None:
    async def scenario() -> None:
        h = Harness(limit=1, awaiting=True)
        h.slots.fit_daemon(3)
        release = asyncio.Event()

        async def handler(msg: Any) -> Any:
            await release.wait()

        h.d.handlers["t"] = handler
        h.deliver(payload=0)  # takes the one slot
        parked = [h.deliver(payload=i) for i in range(1, 4)]
        refused_request = h.deliver(payload=4)
        refused_send = h.deliver(Kind.SEND, payload=5)
        assert h.reading == [], "never paused: an answer is awaited"
        assert [hd[P.ID] for hd, _, _ in h.slots.parked] == parked
        [(key, err, _)] = [o for o in h.out if o[1][P.KIND] == Kind.ERROR]
        assert key[1] == "asker" and err[P.CORR] == refused_request
        assert err[P.ERROR]["code"] == ErrorCode.INBOX_FULL and err[P.ERROR]["retry"]
        [report] = h.pushed
        header = msgpack.unpackb(report[1])
        assert header[P.CORR] == refused_send and header[P.ERROR]["code"] == ErrorCode.HANDLER_ERROR
        assert "INBOX_FULL" in header[P.ERROR]["message"]
        assert h.slots.refused == 2
        # A cancel takes a parked request out and answers CANCELLED.
        h.slots.cancel_parked({P.KIND: Kind.CANCEL, P.CORR: parked[0], P.FROM: "asker"})
        assert len(h.slots.parked) == 2
        assert h.out[-1][1][P.ERROR]["code"] == ErrorCode.CANCELLED
        # No answer awaited any more, every slot taken and park_max work waiting: reading pauses.
        h.awaiting = False
        h.slots.check_reading()
        assert h.reading == [], "two wait: it reads on (a more urgent message may come)"
        h.deliver(payload=6)
        assert h.reading == [False]
        release.set()

    asyncio.run(scenario())


def test_a_call_of_its_own_resumes_reading_until_its_answer_came() -> None:
    async def scenario() -> None:
        h = Harness(limit=1)
        h.slots.fit_daemon(1)
        release = asyncio.Event()

        async def handler(msg: Any) -> Any:
            await release.wait()

        h.d.handlers["t"] = handler
        h.deliver(payload=0)
        h.deliver(payload=1)
        assert h.reading == [False]
        assert h.calls.try_take()  # a running handler sends a request: its reply must be read
        assert h.reading == [False, True]
        h.calls.give_back()  # answered: every slot still taken, so reading pauses again
        assert h.reading == [False, True, False]
        release.set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert h.reading == [False, True, False, True]

    asyncio.run(scenario())


def test_qos1_work_is_never_refused_and_parked_max_of_it_pauses_reading_anyway() -> None:
    async def scenario() -> None:
        h = Harness(limit=1, awaiting=True)
        h.slots.fit_daemon(2)
        assert h.slots.parked_max == 2 + AGENT_RCVHWM
        h.slots.parked_max = 4  # small enough to fill here
        release = asyncio.Event()

        async def handler(msg: Any) -> Any:
            await release.wait()

        h.d.handlers["t"] = handler
        h.d.begin_unit("u1", 6)
        for i in range(5):
            h.deliver(Kind.SEND, payload=i, unit="u1")
            assert h.reading == ([False] if i == 4 else []), i
        assert len(h.slots.parked) == 4 and h.slots.refused == 0 and not h.out and not h.pushed
        h.deliver(Kind.SEND, payload=5, unit="u1")  # parked too (the rest of a frame set)
        release.set()
        for _ in range(20):
            await asyncio.sleep(0)
        assert not h.slots.parked and h.reading[-1] is True
        [ack] = h.pushed  # every message of the unit ran, then the unit was acked once
        assert msgpack.unpackb(ack[1])[P.IDS] == ["u1"]

    asyncio.run(scenario())


def test_the_bound_must_be_positive() -> None:
    d = Dispatcher("me", enqueue=lambda k, h, p: None, push=lambda f: None, encode=encode_payload,
                   schedule=lambda fn: fn(), closed=lambda: False)
    with pytest.raises(ValidationFailed):
        HandlerSlots("me", 0, dispatch=d.dispatch, push=lambda f: None, enqueue=lambda k, h, p: None,
                     reading=lambda on: None, awaiting=lambda: False)


def test_read_ahead_parks_more_before_pausing_and_serves_it_by_priority() -> None:
    async def scenario() -> None:
        h = Harness(limit=1)
        h.slots.fit_daemon(2)
        h.slots.read_ahead = 5
        release = asyncio.Event()
        order: list[Any] = []

        async def handler(msg: Any) -> Any:
            order.append(msg.payload)
            await release.wait()

        h.d.handlers["t"] = handler
        h.deliver(Kind.SEND, payload="first")  # takes the one slot
        for i in range(4):
            h.slots.offer({P.KIND: Kind.SEND, P.ID: P.new_id(), P.TOPIC: "t", P.FROM: "asker",
                           P.PRIO: 9}, encode_payload(i), None)
        assert h.reading == [], "past park_max (2), within read_ahead (5): it reads on"
        h.slots.offer({P.KIND: Kind.SEND, P.ID: P.new_id(), P.TOPIC: "t", P.FROM: "asker",
                       P.PRIO: 0}, encode_payload("urgent"), None)
        assert h.reading == [False] and len(h.slots.parked) == 5 and h.slots.refused == 0
        release.set()
        for _ in range(30):
            await asyncio.sleep(0)
        assert order == ["first", "urgent", 0, 1, 2, 3]

    asyncio.run(scenario())


def test_a_cancel_that_comes_before_its_request_refuses_it_when_it_comes() -> None:
    """A cancel for a request not started yet (inside a parked batch, or overtaking it) is kept,
    bounded, and the request is answered CANCELLED without its handler running."""
    async def scenario() -> None:
        h = Harness(limit=2)
        ran: list[Any] = []
        h.d.handlers["t"] = lambda msg: ran.append(msg.payload)
        cancel = {P.KIND: Kind.CANCEL, P.ID: P.new_id(), P.CORR: "r1", P.FROM: "asker"}
        assert h.d.cancel(cancel) is False and h.slots.cancel_parked(cancel) is False
        h.d.remember_cancel(cancel)
        other = {P.KIND: Kind.CANCEL, P.ID: P.new_id(), P.CORR: "r2", P.FROM: "mallory"}
        h.d.remember_cancel(other)  # another agent's cancel does not refuse asker's r2
        for msg_id in ("r1", "r2"):
            h.slots.offer({P.KIND: Kind.REQUEST, P.ID: msg_id, P.TOPIC: "t", P.FROM: "asker", P.TO: "me"},
                          encode_payload(msg_id), None)
        await asyncio.sleep(0)
        assert ran == ["r2"], "r1 was cancelled before it came; r2's cancel came from someone else"
        errors = [hdr for _, hdr, _ in h.out if hdr.get(P.KIND) == Kind.ERROR]
        assert [(e.get(P.CORR), e[P.ERROR]["code"]) for e in errors] == [("r1", "CANCELLED")]
        for i in range(EARLY_CANCELS_MAX + 10):  # bounded
            h.d.remember_cancel({P.KIND: Kind.CANCEL, P.CORR: f"x{i}", P.FROM: "asker"})
        assert len(h.d._early_cancels) == EARLY_CANCELS_MAX

    asyncio.run(scenario())
