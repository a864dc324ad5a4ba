"""The client's batcher alone (no sockets, no loop): coalescing, bounds, typed keys, order, and the
incoming side (a batch's inner headers inherit from, to and topic)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from meshd.client.batching import Batcher, BatchKey, split_incoming, to_agent, to_topic
from meshd.wire import protocol as P
from meshd.wire.protocol import FrameError, Kind


class Harness:
    """A batcher whose socket is a list and whose loop is a list of callbacks run on ``end_turn``."""

    def __init__(self, batch_max: int = 4, max_payload_bytes: int = 1 << 20) -> None:
        self.sent: list[list[bytes]] = []
        self.soon: list[Callable[[], None]] = []
        self.busy = False
        self.batches: dict[str, list[str]] = {}
        ids = iter(range(1, 1_000_000))
        self.batcher = Batcher("me", batch_max=batch_max, max_payload_bytes=max_payload_bytes,
                               push=self.sent.append, schedule=lambda fn: self.soon.append(fn),
                               busy=lambda: self.busy, on_batch=self.batches.__setitem__,
                               new_id=lambda: f"b{next(ids)}")

    def end_turn(self) -> None:
        soon, self.soon = self.soon, []
        for fn in soon:
            fn()

    def send(self, key: BatchKey, n: int, kind: str = Kind.SEND, size: int = 1) -> list[str]:
        ids = []
        for _ in range(n):
            msg_id = P.new_id()
            ids.append(msg_id)
            self.batcher.enqueue(key, {P.KIND: kind, P.ID: msg_id, P.TOPIC: "t"}, b"x" * size)
        return ids

    def decoded(self) -> list[tuple[dict[str, Any], list[tuple[dict[str, Any], bytes]]]]:
        """Each frame set sent, as (outer header, its messages with inherited fields)."""
        out = []
        for frames in self.sent:
            messages, _ = split_incoming(frames)
            out.append((P.unpack_header(frames[1]), messages))
        return out


def test_an_idle_client_sends_the_first_message_at_once_and_batches_what_follows() -> None:
    h = Harness(batch_max=64)
    key = to_agent("bob")
    first = h.send(key, 1)
    assert len(h.sent) == 1, "an idle client's message leaves at once"
    rest = h.send(key, 5)
    assert len(h.sent) == 1, "messages in the same turn wait for its end"
    h.end_turn()
    assert len(h.sent) == 2
    (single, [(inner, _)]), (batch, items) = h.decoded()
    assert single[P.KIND] == Kind.SEND and single[P.TO] == "bob" and single[P.FROM] == "me"
    assert inner[P.ID] == first[0]
    assert batch[P.KIND] == Kind.BATCH and batch[P.COUNT] == 5 and batch[P.TO] == "bob"
    assert [h_[P.ID] for h_, _ in items] == rest, "order kept within the batch"
    assert all(h_[P.FROM] == "me" and h_[P.TO] == "bob" for h_, _ in items), "inherited on receipt"


def test_a_busy_socket_makes_even_the_first_message_wait_for_the_batch() -> None:
    h = Harness()
    h.busy = True
    h.send(to_agent("bob"), 3)
    assert h.sent == []
    h.end_turn()
    [(batch, items)] = h.decoded()
    assert batch[P.COUNT] == 3 and len(items) == 3


def test_batch_size_is_bounded_by_batch_max() -> None:
    h = Harness(batch_max=4)
    h.busy = True
    ids = h.send(to_agent("bob"), 10)
    # a full queue leaves at once, without waiting for the end of the turn
    assert len(h.sent) == 2
    h.end_turn()
    counts = [len(items) for _, items in h.decoded()]
    assert counts == [4, 4, 2]
    assert [x[P.ID] for _, items in h.decoded() for x, _ in items] == ids


def test_batch_size_is_bounded_by_bytes() -> None:
    h = Harness(batch_max=64, max_payload_bytes=4096)
    h.busy = True
    h.send(to_agent("bob"), 10, size=1000)
    h.end_turn()
    counts = [len(items) for _, items in h.decoded()]
    assert sum(counts) == 10
    assert max(counts) <= 4096 // 1000, counts


def test_keys_are_typed_and_never_mixed() -> None:
    h = Harness(batch_max=64)
    h.busy = True
    to0 = h.send(to_agent("bob"), 2)
    to1 = h.send(to_agent("bob", qos=1), 2)
    topic = h.send(to_topic("news"), 2, kind=Kind.PUBLISH)
    topic1 = h.send(to_topic("news", qos=1), 2, kind=Kind.PUBLISH)
    h.end_turn()
    got = {(b.get(P.TO), b.get(P.TOPIC), b.get(P.QOS)): [x[P.ID] for x, _ in items]
           for b, items in h.decoded()}
    assert got == {("bob", None, None): to0, ("bob", None, 1): to1,
                   (None, "news", None): topic, (None, "news", 1): topic1}
    assert to_agent("bob", 1) == ("to", "bob", 1, 5)
    assert to_agent("x") != to_topic("x")


def test_awaited_members_of_a_batch_are_reported_for_qos1_and_publish_only() -> None:
    h = Harness(batch_max=64)
    h.busy = True
    h.send(to_agent("bob"), 3)
    qos1 = h.send(to_agent("carol", qos=1), 3)
    pubs = h.send(to_topic("news"), 2, kind=Kind.PUBLISH)
    h.end_turn()
    assert sorted(map(sorted, h.batches.values())) == sorted([sorted(qos1), sorted(pubs)])
    batch_ids = {b[P.ID] for b, _ in h.decoded()}
    assert set(h.batches) <= batch_ids


def test_single_message_of_a_qos1_key_carries_qos() -> None:
    h = Harness()
    h.send(to_agent("bob", qos=1), 1)
    [(header, _)] = h.decoded()
    assert header[P.QOS] == 1 and header[P.KIND] == Kind.SEND
    assert h.batches == {}, "a single message is answered under its own id"


def test_queued_counts_what_has_not_left() -> None:
    h = Harness(batch_max=64)
    h.busy = True
    h.send(to_agent("a"), 3)
    h.send(to_agent("b"), 2)
    assert h.batcher.queued == 5
    h.end_turn()
    assert h.batcher.queued == 0


def test_batch_max_outside_the_protocol_limit_is_refused() -> None:
    with pytest.raises(ValueError):
        Harness(batch_max=P.MAX_BATCH + 1)


def test_split_incoming_marks_a_qos1_unit_and_rejects_garbage() -> None:
    frames = [P.SIGNATURE, P.pack({P.KIND: Kind.SEND, P.ID: "u1", P.QOS: 1, P.FROM: "a"}), b"\x01"]
    messages, unit = split_incoming(frames)
    assert unit == "u1" and len(messages) == 1
    with pytest.raises(FrameError) as err:
        split_incoming([P.SIGNATURE, b"x"])
    assert err.value.reason == "too_few_frames"
    with pytest.raises(FrameError) as err:
        split_incoming([b"NOPE", P.pack({P.KIND: Kind.SEND}), b""])
    assert err.value.reason == "bad_signature"
    with pytest.raises(FrameError) as err:
        split_incoming([P.SIGNATURE, P.pack({P.KIND: Kind.BATCH}), b"\xc1"])
    assert err.value.reason == "batch_undecodable"


def test_after_the_turn_the_client_is_idle_again_and_the_next_message_leaves_at_once() -> None:
    h = Harness(batch_max=64)
    h.send(to_agent("bob"), 3)  # one at once, two batched at the end of the turn
    h.end_turn()
    assert len(h.sent) == 2
    h.end_turn()  # nothing queued, nothing scheduled
    h.send(to_agent("bob"), 1)
    assert len(h.sent) == 3, "idle again: no waiting for the end of the turn"


def test_chunks_are_bounded_by_count_on_their_own() -> None:
    h = Harness(batch_max=4)
    items = [({P.KIND: Kind.SEND, P.ID: str(i)}, b"x") for i in range(10)]
    chunks = h.batcher.chunks(items)
    assert [len(c) for c in chunks] == [4, 4, 2]
    assert [x[P.ID] for c in chunks for x, _ in c] == [str(i) for i in range(10)]


def test_a_single_publication_is_addressed_by_topic() -> None:
    h = Harness()
    h.send(to_topic("news"), 1, kind=Kind.PUBLISH)
    [(header, _)] = h.decoded()
    assert header[P.TOPIC] == "news" and P.TO not in header and header[P.FROM] == "me"


def test_batches_never_mix_priorities_and_lower_ones_leave_first() -> None:
    h = Harness(batch_max=64)
    h.busy = True
    low = h.send(to_agent("bob", priority=9), 3)
    mid = h.send(to_agent("bob"), 2)
    urgent = h.send(to_agent("bob", priority=0), 2)
    h.end_turn()
    got = [(b.get(P.PRIO), [(m[P.ID], m.get(P.PRIO)) for m, _ in items]) for b, items in h.decoded()]
    assert got == [(0, [(i, 0) for i in urgent]), (None, [(i, None) for i in mid]),
                   (9, [(i, 9) for i in low])]
