"""The two halves of a daemon restart without sockets: the client's hold (meshd/client/resend.py) and the
stopping and starting daemon's hand-over of its agents (meshd/delivery/handover.py)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from meshd.client import resend
from meshd.client.resend import RESEND_WINDOW, ResendHold
from meshd.delivery.handover import DEFER_MAX, AgentHandover, peers_settled
from meshd.errors import DaemonStopping, DaemonUnreachable, MeshError, NameTaken
from meshd.mesh.liveness import PeerState
from meshd.testing import async_wait_until
from meshd.wire import protocol as P


def _hold() -> tuple[ResendHold, list[str], list[tuple[str, str]]]:
    sent: list[str] = []
    reported: list[tuple[str, str]] = []
    hold = ResendHold("me", enqueue=lambda key, header, data: sent.append(header[P.ID]),
                      report=lambda err, msg_id: reported.append((err.code, msg_id)))
    return hold, sent, reported


def _item(msg_id: str) -> resend.SentItem:
    return ((P.TO, "you", 0), {P.KIND: "send", P.ID: msg_id}, b"x")


def test_refused_sends_go_first_then_those_made_while_holding_in_order() -> None:
    async def run() -> None:
        hold, sent, reported = _hold()
        for i in range(3):
            hold.remember(f"old{i}", _item(f"old{i}"))
        assert hold.start() is True and hold.holding
        assert hold.start() is False  # one re-registration at a time
        assert await hold.hold_new("new0", _item("new0"))
        assert hold.hold(["old0", "old1", "old2", "unknown"]) == ["unknown"]
        assert await hold.hold_new("new1", _item("new1"))
        assert sent == []
        hold.release(None)
        assert sent == ["old0", "old1", "old2", "new0", "new1"] and reported == []
        assert not hold.holding
        assert await hold.hold_new("late", _item("late")) is False  # not holding: send it normally
    asyncio.run(run())


def test_a_failed_re_registration_reports_every_held_send() -> None:
    async def run() -> None:
        hold, sent, reported = _hold()
        hold.remember("old", _item("old"))
        hold.start()
        hold.hold(["old"])
        await hold.hold_new("new", _item("new"))
        hold.release(DaemonUnreachable("gone"))
        assert sent == [] and reported == [("DAEMON_UNREACHABLE", "old"), ("DAEMON_UNREACHABLE", "new")]
    asyncio.run(run())


def test_the_last_resend_window_sends_are_kept_and_older_ones_go_bounded() -> None:
    hold, _, _ = _hold()
    total = RESEND_WINDOW * 3 + 7
    for i in range(total):
        hold.remember(str(i), _item(str(i)))
        assert len(hold.recent) + len(hold.recent_before) <= 2 * RESEND_WINDOW  # bounded
    last = [str(i) for i in range(total - RESEND_WINDOW, total)]
    assert hold.hold(["0", str(total - RESEND_WINDOW - RESEND_WINDOW - 8)]) == [
        "0", str(total - RESEND_WINDOW - RESEND_WINDOW - 8)]  # two generations back: forgotten
    assert hold.hold(last) == []  # every one of the last RESEND_WINDOW can go again
    assert [msg_id for msg_id, _ in hold.held] == last
    assert hold.hold(last[:1]) == last[:1]  # held once, not twice


def test_the_bytes_bound_rolls_a_generation_too() -> None:
    hold, _, _ = _hold()
    big = ((P.TO, "you", 0), {P.KIND: "send", P.ID: "b"}, b"x" * (resend.RESEND_WINDOW_BYTES // 4))
    for i in range(9):
        hold.remember(str(i), big)
        assert hold.recent_bytes < resend.RESEND_WINDOW_BYTES
    assert len(hold.recent) + len(hold.recent_before) <= 8  # at most twice the bytes bound


def test_a_full_hold_makes_send_wait_until_the_release() -> None:
    async def run() -> None:
        hold, sent, _ = _hold()
        hold.start()
        for i in range(RESEND_WINDOW):
            assert await hold.hold_new(str(i), _item(str(i)))
        assert hold.full()
        waiter = asyncio.ensure_future(hold.hold_new("one more", _item("one more")))
        await asyncio.sleep(0)
        assert not waiter.done()  # bounded: it waits instead of growing the hold
        hold.release(None)
        assert await waiter is False  # released: the caller sends it the usual way
        assert len(sent) == RESEND_WINDOW
    asyncio.run(run())


def test_daemon_stopping_answers_are_retried_without_using_attempts() -> None:
    answers: list[MeshError | None] = [DaemonStopping("stopping", retry_after=0.001)] * (
        resend.REREGISTER_ATTEMPTS + 2) + [None]

    async def register() -> None:
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    async def run() -> None:
        hold, sent, reported = _hold()
        hold.remember("m", _item("m"))
        hold.start()
        hold.hold(["m"])
        await hold.reregister(register, lambda: False)
        assert sent == ["m"] and reported == [] and not hold.reregistering
    asyncio.run(run())


def test_daemon_stopping_for_longer_than_restart_wait_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resend, "RESTART_WAIT", 0.0)

    async def register() -> None:
        raise DaemonStopping("stopping", retry_after=0.001)

    async def run() -> None:
        hold, sent, reported = _hold()
        hold.start()
        await hold.hold_new("m", _item("m"))
        await hold.reregister(register, lambda: False)
        assert sent == [] and reported == [("DAEMON_STOPPING", "m")]
    asyncio.run(run())


def test_a_refused_name_is_not_retried() -> None:
    async def register() -> None:
        raise NameTaken("taken")

    async def run() -> None:
        hold, _, reported = _hold()
        hold.start()
        await hold.hold_new("m", _item("m"))
        await hold.reregister(register, lambda: False)
        assert reported == [("NAME_TAKEN", "m")]
    asyncio.run(run())


class FakeLink:
    def __init__(self) -> None:
        self.errors: list[tuple[bytes, Any, str]] = []
        self.backlog_empty = True

    def send_error(self, rid: bytes, corr: Any, code: str, message: str, *,
                   retry_after: float | None = None) -> None:
        assert retry_after is not None  # DAEMON_STOPPING is retryable
        self.errors.append((rid, corr, code))


class FakeDirectory:
    def __init__(self, rids: list[bytes]) -> None:
        self.local_by_rid: dict[bytes, object] = {rid: object() for rid in rids}


def _handover(rids: list[bytes], settled: Callable[[], bool] | None = None
              ) -> tuple[AgentHandover, FakeLink, FakeDirectory, list[Any]]:
    link, directory, registered = FakeLink(), FakeDirectory(rids), []
    handover = AgentHandover(link, directory, Counter(),  # type: ignore[arg-type]
                             register=lambda rid, msg_id, frames: registered.append((rid, msg_id)),
                             settled=settled)
    return handover, link, directory, registered


def test_the_stop_notice_goes_to_every_agent_and_a_register_answers_it() -> None:
    handover, link, directory, _ = _handover([b"a", b"b", b"c"])
    handover.begin()
    assert sorted(link.errors) == [(r, None, P.ErrorCode.DAEMON_STOPPING) for r in (b"a", b"b", b"c")]
    handover.answered(b"a", "reg-1")
    assert link.errors[-1] == (b"a", "reg-1", P.ErrorCode.DAEMON_STOPPING)
    assert b"a" in handover.unanswered()  # it has not read that refusal yet
    handover.answered(b"a", "reg-2")  # now it has: and every answer queued before it
    del directory.local_by_rid[b"b"]  # it left: nothing to wait for
    assert handover.unanswered() == [b"c"]


def test_finish_waits_for_answers_and_drains_the_socket_in_bounds() -> None:
    async def run() -> None:
        handover, _, _, _ = _handover([b"a", b"slow"])
        handover.begin()
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, handover.answered, b"a", "r1")
        loop.call_later(0.02, handover.answered, b"a", "r2")
        await handover.finish(None, lambda frames: None, grace=0.2)
        assert handover.unanswered() == [b"slow"]  # the grace passed: counted, not waited for
        assert handover.stats["stop_unanswered"] == 1
    asyncio.run(run())


def _register_frames(name: str) -> list[bytes]:
    return [b"rid", P.SIGNATURE, P.pack({P.KIND: "register"}), P.pack({"name": name})]


def test_registrations_wait_for_ready_in_order_but_the_system_agent_does_not() -> None:
    async def run() -> None:
        handover, _, _, registered = _handover([])
        assert not handover.defer(b"x", "0", _register_frames("early"))  # not starting: at once
        handover.hold_registrations(settle=60)
        assert handover.defer(b"p", "1", _register_frames("producer"))
        assert not handover.defer(b"s", "2", _register_frames("meshd.sys.0123456789abcdef"))
        assert handover.defer(b"q", "3", _register_frames("other"))
        assert registered == []
        handover.open_registrations()
        assert registered == [(b"p", "1"), (b"q", "3")]
        assert not handover.defer(b"r", "4", _register_frames("later"))
    asyncio.run(run())


def test_registrations_open_after_the_settle_time_and_past_the_bound() -> None:
    async def run() -> None:
        handover, _, _, registered = _handover([])
        handover.hold_registrations(settle=0.01)
        for i in range(DEFER_MAX):
            assert handover.defer(b"p", str(i), _register_frames("p"))
        assert not handover.defer(b"p", "over", _register_frames("p"))  # bounded: at once
        await async_wait_until(lambda: not handover.starting, timeout=5, what="registrations open")
        assert len(registered) == DEFER_MAX
    asyncio.run(run())


def test_a_stop_before_ready_refuses_the_deferred_registrations() -> None:
    async def run() -> None:
        handover, link, _, registered = _handover([])
        handover.hold_registrations(settle=60)
        assert handover.defer(b"p", "1", _register_frames("producer"))
        handover.begin()
        assert registered == [] and link.errors == [(b"p", "1", P.ErrorCode.DAEMON_STOPPING)]
        assert not handover.starting
    asyncio.run(run())


class FakePeer:
    def __init__(self, state: PeerState, link_up: bool = False) -> None:
        self.state = state
        self.link_up = link_up


def test_peers_settled_means_none_half_way() -> None:
    assert peers_settled([])
    assert peers_settled([FakePeer(PeerState.ONLINE), FakePeer(PeerState.OFFLINE)])  # a dead record
    assert not peers_settled([FakePeer(PeerState.ONE_WAY)])  # greeted, not confirmed yet
    assert not peers_settled([FakePeer(PeerState.STALE)])
    assert not peers_settled([FakePeer(PeerState.OFFLINE, link_up=True)])  # connected, no HELLO yet


def test_ready_waits_for_the_peers_within_the_settle_time() -> None:
    async def run() -> None:
        peers = [FakePeer(PeerState.ONE_WAY)]
        handover, _, _, registered = _handover([], settled=lambda: peers_settled(peers))
        handover.hold_registrations(settle=60)
        assert handover.defer(b"p", "1", _register_frames("producer"))
        handover.ready()
        await asyncio.sleep(0.05)
        assert registered == [] and handover.starting  # READY, but a peer is half-way
        peers[0].state = PeerState.ONLINE
        await async_wait_until(lambda: registered == [(b"p", "1")], timeout=5, what="registered")

        handover, _, _, registered = _handover([], settled=lambda: False)
        handover.hold_registrations(settle=0.05)  # a peer that never settles
        assert handover.defer(b"q", "2", _register_frames("producer"))
        handover.ready()
        await async_wait_until(lambda: registered == [(b"q", "2")], timeout=5, what="settle time")
    asyncio.run(run())
