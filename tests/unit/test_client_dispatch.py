"""The client's handler dispatch alone (no sockets): replies, errors, deadlines, DEFER, cancel and
qos-1 unit acks, with the outgoing side recorded in lists."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import msgpack

from meshd import protocol as P
from meshd.batching import BatchKey
from meshd.dispatch import DEFER, Dispatcher, Message
from meshd.payloads import decode_payload, encode_payload
from meshd.protocol import ErrorCode, Kind


class Harness:
    def __init__(self) -> None:
        self.out: list[tuple[BatchKey, dict[str, Any], bytes]] = []
        self.pushed: list[list[bytes]] = []
        self.soon: list[Callable[[], None]] = []
        self.d = Dispatcher("me", enqueue=lambda k, h, p: self.out.append((k, h, p)),
                            push=self.pushed.append, encode=encode_payload,
                            schedule=lambda fn: self.soon.append(fn), closed=lambda: False)

    def end_turn(self) -> None:
        soon, self.soon = self.soon, []
        for fn in soon:
            fn()

    def deliver(self, kind: str = Kind.REQUEST, topic: str = "t", payload: Any = None,
                unit: str | None = None, **extra: Any) -> str:
        msg_id = P.new_id()
        header = {P.KIND: kind, P.ID: msg_id, P.TOPIC: topic, P.FROM: "asker", P.TO: "me", **extra}
        self.d.dispatch(header, encode_payload(payload), unit)
        return msg_id

    def answers(self) -> list[tuple[str, dict[str, Any], Any]]:
        return [(k[1], h, decode_payload(p)) for k, h, p in self.out]

    def acked(self) -> list[str]:
        return [i for frames in self.pushed for i in msgpack.unpackb(frames[1])[P.IDS]]


def test_a_request_handlers_return_value_is_the_reply_to_the_requester() -> None:
    h = Harness()
    h.d.handlers["t"] = lambda m: {"echo": m.payload, "from": m.sender}
    msg_id = h.deliver(payload=7)
    [(dest, header, payload)] = h.answers()
    assert dest == "asker" and header[P.KIND] == Kind.REPLY and header[P.CORR] == msg_id
    assert payload == {"echo": 7, "from": "asker"}


def test_a_delegated_request_is_answered_to_its_origin() -> None:
    h = Harness()
    h.d.handlers["*"] = lambda m: "ok"
    h.deliver(topic="other", **{P.ORIGIN: "planner", P.CORR: "c1"})
    [(dest, header, _)] = h.answers()
    assert dest == "planner" and header[P.CORR] == "c1"


def test_a_raising_handler_fails_that_request_only() -> None:
    h = Harness()

    def handler(m: Message) -> Any:
        if m.payload == "bad":
            raise KeyError("nope")
        return "fine"

    h.d.handlers["t"] = handler
    h.deliver(payload="bad")
    h.deliver(payload="good")
    (_, err, _), (_, ok, data) = h.answers()
    assert err[P.KIND] == Kind.ERROR and err[P.ERROR]["code"] == ErrorCode.HANDLER_ERROR
    assert err[P.ERROR]["type"] == "KeyError"
    assert ok[P.KIND] == Kind.REPLY and data == "fine"


def test_no_handler_and_a_passed_deadline_are_errors_without_running_anything() -> None:
    h = Harness()
    ran: list[Message] = []
    h.deliver(topic="unknown")
    h.d.handlers["t"] = ran.append
    h.deliver(**{P.DEADLINE: time.time() - 1})
    (_, no_handler, _), (_, late, _) = h.answers()
    assert no_handler[P.ERROR]["code"] == ErrorCode.HANDLER_ERROR
    assert late[P.ERROR]["code"] == ErrorCode.TIMEOUT
    assert ran == []


def test_defer_sends_nothing_until_reply() -> None:
    h = Harness()
    kept: list[Message] = []
    h.d.handlers["t"] = lambda m: kept.append(m) or DEFER
    h.deliver()
    assert h.out == []
    h.d.reply(kept[0], "later")
    [(_, header, payload)] = h.answers()
    assert header[P.KIND] == Kind.REPLY and payload == "later"


def test_a_qos1_unit_is_acked_once_after_all_its_messages_were_handled() -> None:
    h = Harness()
    seen: list[Any] = []
    h.d.handlers["t"] = lambda m: seen.append(m.payload)
    h.d.begin_unit("u1", 3)
    h.deliver(Kind.SEND, payload=1, unit="u1")
    h.deliver(Kind.SEND, payload=2, unit="u1")
    h.end_turn()
    assert h.acked() == [], "two of three handled: no ack yet"
    h.deliver(Kind.SEND, payload=3, unit="u1")
    assert h.acked() == [], "acks leave at the end of the turn"
    h.end_turn()
    assert h.acked() == ["u1"] and seen == [1, 2, 3]


def test_a_cancel_from_the_requester_cancels_the_running_handler() -> None:
    async def scenario() -> Harness:
        h = Harness()
        started = asyncio.Event()

        async def slow(m: Message) -> str:
            started.set()
            await asyncio.sleep(30)
            return "too late"

        h.d.handlers["t"] = slow
        msg_id = h.deliver()
        await started.wait()
        h.d.cancel({P.KIND: Kind.CANCEL, P.CORR: msg_id, P.FROM: "intruder"})
        await asyncio.sleep(0)
        assert h.out == [], "a cancel from someone else is ignored"
        h.d.cancel({P.KIND: Kind.CANCEL, P.CORR: msg_id, P.FROM: "asker"})
        await asyncio.gather(*h.d.tasks, return_exceptions=True)
        return h

    h = asyncio.run(scenario())
    [(dest, header, _)] = h.answers()
    assert dest == "asker" and header[P.ERROR]["code"] == ErrorCode.CANCELLED


def test_a_cancel_follows_a_delegation() -> None:
    h = Harness()
    h.d.delegated("c9", "expert", "asker")
    h.d.cancel({P.KIND: Kind.CANCEL, P.CORR: "c9", P.FROM: "asker"})
    [(dest, header, _)] = h.answers()
    assert dest == "expert" and header[P.KIND] == Kind.CANCEL and header[P.CORR] == "c9"


def test_many_acks_at_once_are_split_so_each_header_fits() -> None:
    """Issue 8, item 7: ~500 unit ids acked in one turn made one 8.4 KB header, refused by the
    daemon's 8 KiB header cap, so those units were never acked (and later UNDELIVERABLE)."""
    h = Harness()
    h.d.handlers["t"] = lambda m: None
    units = [f"{P.new_id()}>subscriber-{n}" for n in range(600)]
    for unit in units:
        h.d.begin_unit(unit, 1)
        h.deliver(Kind.SEND, unit=unit)
    h.end_turn()
    sizes = [len(frames[1]) for frames in h.pushed]
    print(f"600 acks: {len(sizes)} ack messages, largest header {max(sizes)} bytes")
    for frames in h.pushed:
        assert P.unpack_header(frames[1])[P.KIND] == Kind.ACK  # within the daemon's limits
    assert h.acked() == units
