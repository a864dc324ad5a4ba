"""The qos-1 machine and its store alone: a fake clock, an in-memory SQLite, no sockets."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshd.qos1.machine import Acked, Attempt, Confirm, DeliveryStore, GiveUp, Qos1, SendAcks
from meshd.wire import protocol as P
from meshd.wire.protocol import Kind


class Clock:
    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall = 1_700_000_000.0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


def _frames(unit_id: str, to: str = "researcher", topic: str = "t") -> list[bytes]:
    return P.frames({P.KIND: Kind.SEND, P.ID: unit_id, P.FROM: "planner", P.TO: to, P.TOPIC: topic,
                     P.QOS: 1}, b"payload")


@pytest.fixture()
def clock() -> Clock:
    return Clock()


def _machine(clock: Clock, store: DeliveryStore | None = None, attempts: int = 3) -> Qos1:
    store = store or DeliveryStore(":memory:", wall=lambda: clock.wall, monotonic=lambda: clock.mono)
    return Qos1(store, attempts=attempts, ack_timeout=5.0, ttl=60.0,
                monotonic=lambda: clock.mono, wall=lambda: clock.wall)


def test_confirm_and_first_attempt_only_after_the_commit(clock: Clock) -> None:
    q = _machine(clock)
    q.accept(b"rid1", "planner", "u1", "researcher", _frames("u1"))
    assert q.needs_flush and q.store.commits == 0
    actions = q.flush()
    assert q.store.commits == 1
    assert actions[0] == Confirm(b"rid1", "u1")
    assert isinstance(actions[1], Attempt) and actions[1].entry.id == "u1"
    entry = actions[1].entry
    assert entry.header is not None and entry.header.topic == "t" and entry.header.kind == Kind.SEND
    assert q.needs_flush and q.flush() == []  # the attempt counter is persisted by the next commit
    assert not q.needs_flush and q.store.commits == 2


def test_ack_removes_the_unit(clock: Clock) -> None:
    q = _machine(clock)
    q.accept(None, "planner", "u1", "researcher", _frames("u1"))
    q.flush()
    [acked] = q.acks_arrived(["u1", "unknown"])
    assert isinstance(acked, Acked) and acked.entry.id == "u1" and q.pending == 0
    q.flush()
    assert q.store.db.execute("SELECT COUNT(*) FROM outbox").fetchone() == (0,)


def test_retries_back_off_then_give_up(clock: Clock) -> None:
    q = _machine(clock, attempts=3)
    q.accept(None, "planner", "u1", "researcher", _frames("u1"))
    q.flush()  # attempt 1, next after 5 s
    assert q.tick() == []
    clock.advance(5.1)
    [a2] = q.tick()
    assert isinstance(a2, Attempt) and a2.entry.attempts == 2
    clock.advance(5.1)
    assert q.tick() == []  # the second wait is 10 s
    clock.advance(5.0)
    [a3] = q.tick()
    assert isinstance(a3, Attempt) and a3.entry.attempts == 3
    clock.advance(20.1)
    [gave_up] = q.tick()
    assert isinstance(gave_up, GiveUp) and "no ack after 3 attempt(s)" in gave_up.why
    assert q.pending == 0 and q.stats["dead_lettered"] == 1


def test_a_bounce_refunds_the_attempt_and_waits(clock: Clock) -> None:
    q = _machine(clock, attempts=1)
    q.accept(None, "planner", "u1", "researcher", _frames("u1"))
    q.flush()
    assert q.bounced("u1", "INBOX_FULL") and not q.bounced("other", "INBOX_FULL")
    clock.advance(0.5)
    [again] = q.tick()  # not given up: the bounce was not an attempt
    assert isinstance(again, Attempt) and again.entry.extra["last_error"] == "INBOX_FULL"


def test_ttl_expiry_names_the_last_error(clock: Clock) -> None:
    q = _machine(clock, attempts=100)
    q.accept(None, "planner", "u1", "researcher", _frames("u1"))
    q.flush()
    q.bounced("u1", "PEER_UNREACHABLE")
    clock.advance(61)
    [gave_up] = q.tick()
    assert isinstance(gave_up, GiveUp) and "PEER_UNREACHABLE" in gave_up.why


def test_a_client_retry_of_a_durable_unit_is_confirmed_again(clock: Clock) -> None:
    q = _machine(clock)
    q.accept(b"rid1", "planner", "u1", "researcher", _frames("u1"))
    q.flush()
    q.accept(b"rid2", "planner", "u1", "researcher", _frames("u1"))
    assert q.stats["accepted"] == 1 and q.needs_flush
    assert q.flush() == [Confirm(b"rid2", "u1")]


def test_receiver_hands_a_unit_once_and_acks_after_the_done_mark_commits(clock: Clock) -> None:
    q = _machine(clock)
    assert q.admit("u1", "nodeA", b"agent", rid_alive=lambda rid: True)
    assert not q.admit("u1", "nodeA", b"agent", rid_alive=lambda rid: True)  # still with the agent
    assert q.stats["dup_in_flight"] == 1
    q.agent_acked(["u1"])
    assert q.store.is_done("u1") and q.in_flight == 0
    assert q.flush() == [SendAcks("nodeA", ["u1"])]
    assert not q.admit("u1", "nodeA", b"agent", rid_alive=lambda rid: True)  # done: re-acked
    assert q.flush() == [SendAcks("nodeA", ["u1"])]
    assert q.reack_if_done("u1", "nodeA") and not q.reack_if_done("u2", "nodeA")


def test_a_gone_agent_gets_the_unit_again(clock: Clock) -> None:
    q = _machine(clock)
    assert q.admit("u1", "nodeA", b"agent1", rid_alive=lambda rid: True)
    assert q.admit("u1", "nodeA", b"agent1", rid_alive=lambda rid: False)  # its connection died
    q.not_delivered("u1")
    assert q.admit("u1", "nodeA", b"agent2", rid_alive=lambda rid: True)
    clock.advance(700)
    q.forget_delivering(older_than=600)
    assert q.in_flight == 0


def test_outbox_and_done_marks_survive_a_restart(tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / "delivery.db"
    q = _machine(clock, DeliveryStore(path, wall=lambda: clock.wall, monotonic=lambda: clock.mono))
    q.accept(None, "planner", "u1", "researcher", _frames("u1"))
    q.flush()  # attempt 1 recorded
    q.admit("in1", "nodeB", b"a", rid_alive=lambda rid: True)
    q.agent_acked(["in1"])
    q.flush()
    q.store.close()
    store = DeliveryStore(path, wall=lambda: clock.wall, monotonic=lambda: clock.mono)
    entry = store.outbox["u1"]
    assert entry.attempts == 1 and entry.sender == "planner" and entry.durable
    assert entry.header is not None and entry.header.to == "researcher"  # decoded once, at load
    assert store.is_done("in1") and store.done_for("nodeB", since=0) == ["in1"]
    again = _machine(clock, store)
    [attempt] = again.tick()  # after a restart everything is due at once
    assert isinstance(attempt, Attempt) and attempt.entry.attempts == 2
    store.close()


def test_reack_origin_after_a_peer_restart(clock: Clock) -> None:
    q = _machine(clock)
    for i in range(3):
        q.admit(f"in{i}", "nodeB", b"a", rid_alive=lambda rid: True)
    q.agent_acked(["in0", "in1", "in2"])
    q.flush()
    assert q.reack_origin("nodeB", since=clock.mono - 10) == 3
    assert q.flush() == [SendAcks("nodeB", ["in0", "in1", "in2"])]
    assert q.reack_origin("nodeC", since=0) == 0


def test_seen_marks_are_pruned_after_their_ttl(clock: Clock) -> None:
    store = DeliveryStore(":memory:", seen_ttl=100.0, wall=lambda: clock.wall, monotonic=lambda: clock.mono)
    store.mark_done("old", "n")
    store.flush()
    clock.advance(101)
    store.mark_done("new", "n")
    store.flush()
    assert store.prune_seen() == 1
    assert not store.is_done("old") and store.is_done("new")


def test_group_commit_writes_many_units_in_one_transaction(clock: Clock) -> None:
    q = _machine(clock)
    for i in range(50):
        q.accept(None, "planner", f"u{i}", "researcher", _frames(f"u{i}"))
    actions = q.flush()
    assert q.store.commits == 1 and sum(isinstance(a, Attempt) for a in actions) == 50


def test_a_wall_clock_jump_neither_expires_units_nor_prunes_done_marks(clock: Clock) -> None:
    """qos1_ttl and the done-marks' age run on the monotonic clock (a wall-clock jump moves neither)."""
    q = _machine(clock, attempts=100)
    q.accept(None, "planner", "u1", "researcher", _frames("u1"))
    q.admit("in1", "nodeB", b"a", rid_alive=lambda rid: True)
    q.agent_acked(["in1"])
    q.flush()
    clock.wall += 10 * 3600  # the wall clock jumps ten hours ahead (TTL 60 s, seen_ttl 1 day)
    q.bounced("u1", "PEER_UNREACHABLE")
    clock.mono += 1.0
    assert not [a for a in q.tick() if isinstance(a, GiveUp)]
    assert q.pending == 1
    clock.wall -= 20 * 3600  # and back, ten hours behind where it started
    assert q.store.prune_seen() == 0 and q.store.is_done("in1")
    assert q.reack_origin("nodeB", since=clock.mono - 10) == 1
    clock.mono += 60.0  # the TTL does run out on the monotonic clock
    assert [a for a in q.tick() if isinstance(a, GiveUp)]


def test_the_ttl_left_survives_a_restart_by_the_same_hosts_clock(tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / "delivery.db"
    q = _machine(clock, DeliveryStore(path, wall=lambda: clock.wall, monotonic=lambda: clock.mono))
    q.accept(None, "planner", "u1", "researcher", _frames("u1"))
    q.flush()
    q.store.close()
    clock.advance(20)
    clock.mono = 5.0  # a reboot: the monotonic clock starts again
    store = DeliveryStore(path, wall=lambda: clock.wall, monotonic=lambda: clock.mono)
    assert store.outbox["u1"].expires_m == pytest.approx(5.0 + 40.0)
    store.close()


def test_a_nack_with_retry_waits_its_delay_within_the_attempts(clock: Clock) -> None:
    q = _machine(clock, attempts=2)
    q.accept(None, "planner", "u1", "researcher", _frames("u1"))
    q.flush()  # attempt 1
    assert q.nacked("u1", {"code": "NACK", "retry": True, "retry_after": 30}) == []
    clock.advance(29)
    assert q.tick() == []  # the handler's delay, not the 5 s ack timeout
    clock.advance(1.1)
    [again] = q.tick()
    assert isinstance(again, Attempt) and again.entry.attempts == 2
    q.nacked("u1", {"code": "NACK", "retry": True, "retry_after": 1})
    clock.advance(1.1)
    [gave_up] = q.tick()  # out of attempts: a NACK retry uses one
    assert isinstance(gave_up, GiveUp) and gave_up.reason == P.ErrorCode.UNDELIVERABLE
    assert q.stats["nack_retries"] == 2


def test_a_nack_without_retry_gives_up_at_once_and_the_receiver_keeps_a_done_mark(clock: Clock) -> None:
    q = _machine(clock)
    q.accept(None, "planner", "u1", "researcher", _frames("u1"))
    q.flush()
    [gave_up] = q.nacked("u1", {"code": "NACK", "retry": False, "message": "not mine", "fallback": "x"})
    assert isinstance(gave_up, GiveUp) and gave_up.reason == "nack" and "not mine" in gave_up.why
    assert gave_up.error is not None and gave_up.error["fallback"] == "x" and q.pending == 0
    assert q.nacked("u1", {"retry": False}) == []  # gone already
    # receiver side: a refused-for-good unit is done (a late copy is dropped), a retried one is not
    r = _machine(clock)
    assert r.admit("u2", "nodeA", b"rid", lambda rid: True)
    [nack] = r.agent_nacked("u2", {"retry": False})
    assert nack.origin == "nodeA" and nack.unit_id == "u2"  # type: ignore[union-attr]
    r.flush()
    assert r.store.is_done("u2")
    assert r.admit("u3", "nodeA", b"rid", lambda rid: True)
    r.agent_nacked("u3", {"retry": True, "retry_after": 1})
    assert not r.store.is_done("u3") and r.admit("u3", "nodeA", b"rid", lambda rid: True)
def test_due_retries_go_lowest_priority_first(clock: Clock) -> None:
    q = _machine(clock)
    for unit, prio in (("u9", 9), ("u5", None), ("u0", 0), ("u9b", 9)):
        header = {P.KIND: Kind.SEND, P.ID: unit, P.FROM: "planner", P.TO: "r", P.TOPIC: "t", P.QOS: 1}
        if prio is not None:
            header[P.PRIO] = prio
        q.accept(None, "planner", unit, "r", P.frames(header, b"p"))
    q.flush()
    clock.advance(5.1)
    assert [a.entry.id for a in q.tick() if isinstance(a, Attempt)] == ["u0", "u5", "u9", "u9b"]
