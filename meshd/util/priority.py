"""A FIFO served by priority: lower numbers first, arrival order within one priority.

Where a message waits in user space (a client's parked work, a daemon's held publications), it
waits in one of these, so a priority-0 message overtakes a backlog of priority-9 ones but never
one of its own priority (docs/PROTOCOL.md, priorities). Ten buckets, so every operation but
``remove`` is O(1) (``popleft`` looks at most at ten buckets).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["DEFAULT_PRIORITY", "LEVELS", "PriorityFifo", "priority_of"]

T = TypeVar("T")

DEFAULT_PRIORITY = 5
"""A message without a priority has this one."""
LEVELS = 10
"""Priorities 0 (served first) to 9."""


def priority_of(value: object) -> int:
    """A priority as carried by a header: an int 0..9; anything else counts as the default (a
    daemon refused out-of-range values at its edge; an inner batch header is not checked there)."""
    return value if type(value) is int and 0 <= value < LEVELS else DEFAULT_PRIORITY


class PriorityFifo(Generic[T]):
    """``append``, ``popleft``, ``len``, iteration in service order; ``priority(item)`` says an
    item's priority."""

    def __init__(self, priority: Callable[[T], int]) -> None:
        self._priority = priority
        self._buckets: list[deque[T]] = [deque() for _ in range(LEVELS)]
        self._len = 0
        self._lowest = LEVELS  # no bucket below this holds anything

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[T]:
        for bucket in self._buckets:
            yield from bucket

    def append(self, item: T) -> None:
        level = self._priority(item)
        self._buckets[level].append(item)
        self._len += 1
        if level < self._lowest:
            self._lowest = level

    def popleft(self) -> T:
        """The next item: the oldest of the lowest priority. IndexError when empty."""
        if not self._len:
            raise IndexError("pop from an empty PriorityFifo")
        buckets = self._buckets
        level = self._lowest
        while not buckets[level]:
            level += 1
        self._lowest = level
        self._len -= 1
        return buckets[level].popleft()

    def peek(self) -> T:
        """The item ``popleft`` would return, left in place."""
        for bucket in self._buckets:
            if bucket:
                return bucket[0]
        raise IndexError("peek at an empty PriorityFifo")

    def remove(self, item: T) -> None:
        self._buckets[self._priority(item)].remove(item)
        self._len -= 1

    def clear(self) -> None:
        for bucket in self._buckets:
            bucket.clear()
        self._len = 0
        self._lowest = LEVELS
