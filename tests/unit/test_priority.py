"""Priorities where messages wait in user space: the FIFO served by priority, the batcher's
keys and flush order, the parked work of a busy agent, and the header's range check."""

from __future__ import annotations

import pytest

from meshd.client.batching import to_agent
from meshd.util.priority import PriorityFifo, priority_of
from meshd.wire import protocol as P
from meshd.wire.protocol import FrameError, Kind


def test_lower_first_fifo_within_one() -> None:
    q: PriorityFifo[tuple[int, str]] = PriorityFifo(lambda item: item[0])
    for item in [(9, "a"), (5, "b"), (9, "c"), (0, "d"), (5, "e"), (0, "f")]:
        q.append(item)
    assert [x for _, x in q] == ["d", "f", "b", "e", "a", "c"]  # iteration is service order
    assert q.peek() == (0, "d")
    q.remove((5, "b"))
    out = [q.popleft()[1] for _ in range(len(q))]
    assert out == ["d", "f", "e", "a", "c"] and not q
    with pytest.raises(IndexError):
        q.popleft()
    q.append((3, "x"))
    assert q.popleft() == (3, "x")


def test_priority_of_takes_only_a_valid_one() -> None:
    assert [priority_of(v) for v in (0, 9, None, 10, -1, "1", 2.0, True)] == [0, 9, 5, 5, 5, 5, 5, 5]


@pytest.mark.parametrize("bad", [-1, 10, "0", 1.5, True])
def test_the_header_range_is_checked(bad: object) -> None:
    with pytest.raises(FrameError, match="'prio'"):
        P.header_from_map({P.KIND: Kind.SEND, P.ID: "x", P.PRIO: bad})
    assert P.header_from_map({P.KIND: Kind.SEND, P.ID: "x", P.PRIO: 0}).fields[P.PRIO] == 0


def test_batch_keys_differ_by_priority() -> None:
    assert to_agent("bob") != to_agent("bob", priority=0)
