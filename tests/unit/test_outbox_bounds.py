"""The qos-1 outbox's bounds (an agent that never reads must not fill disk and memory), on the
sans-I/O machine with an SQLite file."""

from __future__ import annotations

from pathlib import Path

from meshd.qos1.bounds import UNIT_OVERHEAD, OutboxBounds, unit_size
from meshd.qos1.machine import DeliveryStore, Qos1
from meshd.wire import protocol as P


def _unit(i: int, dest: str, size: int = 100) -> tuple[str, list[bytes]]:
    unit_id = f"u{i}"
    header = {P.KIND: "send", P.ID: unit_id, P.FROM: "me", P.TO: dest, P.TOPIC: "t", P.QOS: 1}
    return unit_id, [P.SIGNATURE, P.pack(header), b"x" * size]


def test_bounds_refuse_then_free_room_and_survive_a_restart(tmp_path: Path) -> None:
    bounds = OutboxBounds(total_units=5, total_bytes=10**9, per_dest_units=3,
                          per_dest_bytes=3 * (UNIT_OVERHEAD + 200) + 50)
    store = DeliveryStore(tmp_path / "delivery.db")
    q = Qos1(store, attempts=3, ack_timeout=1.0, ttl=60.0, bounds=bounds)
    for i in range(3):
        uid, frames = _unit(i, "a")
        assert q.refusal(uid, "a", frames) is None
        q.accept(b"r", "me", uid, "a", frames)
    uid, frames = _unit(3, "a")
    why = q.refusal(uid, "a", frames)
    assert why is not None and "qos1_outbox_per_dest_max" in why
    assert q.refusal("u0", "a", _unit(0, "a")[1]) is None  # a client's retry is confirmed again
    for i in range(10, 12):
        uid, frames = _unit(i, "b")
        assert q.refusal(uid, "b", frames) is None
        q.accept(b"r", "me", uid, "b", frames)
    uid, frames = _unit(12, "c")
    assert "qos1_outbox_max)" in str(q.refusal(uid, "c", frames))
    big_id, big = _unit(13, "b", size=4 * (UNIT_OVERHEAD + 200))
    assert "qos1_outbox_per_dest_max_bytes" in str(q.refusal(big_id, "b", big))
    assert q.stats["refused_outbox_full"] == 3
    q.flush()
    q.acks_arrived(["u0"])  # an ack frees room for its destination
    assert q.refusal("u3", "a", _unit(3, "a")[1]) is None
    assert store.dest_units["a"] == 2 and store.total_bytes == sum(
        unit_size(_unit(i, d)[1]) for i, d in ((1, "a"), (2, "a"), (10, "b"), (11, "b")))
    q.flush()
    store.close()
    reopened = DeliveryStore(tmp_path / "delivery.db")  # counts rebuilt from the file
    assert dict(reopened.dest_units) == {"a": 2, "b": 2}
    assert reopened.total_bytes == store.total_bytes
    reopened.close()
