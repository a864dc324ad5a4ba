"""Task and plan deadlines on this host's monotonic clock (wall clocks jump and differ between hosts).

Owns: the monotonic end of each task and plan deadline this daemon drives, in memory, at most
``capacity`` of them (the oldest is forgotten first and read again from its record when next
needed). A record's stored ``deadline`` is this host's wall-clock time: shown to people, and the
only clock that survives a restart, so it is read once per record per start, clamped to the time
the record was given; after that a wall-clock jump moves no deadline. A task of a plan ends with
its plan. It must not touch the store, the records or any scheduling decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Deadlines"]


class Deadlines:
    """``left(record)``: seconds until a task's or plan's deadline, by the monotonic clock."""

    def __init__(self, capacity: int, *, monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.capacity = max(1, capacity)
        self._monotonic = monotonic
        self._wall = wall
        self._ends: dict[str, float] = {}

    def left(self, record: Mapping[str, Any]) -> float:
        """Seconds left (negative once passed) of ``record``'s deadline."""
        key = str(record["id"])
        end = self._ends.get(key)
        if end is None:
            end = self._ends.get(str(record.get("plan_id")))  # a plan's task ends with its plan
            if end is None:
                deadline = float(record["deadline"])
                given = max(0.0, deadline - float(record.get("created_at") or deadline))
                end = self._monotonic() + min(max(deadline - self._wall(), 0.0), given)
            self._remember(key, end)
        return end - self._monotonic()

    def forget(self, key: str) -> None:
        self._ends.pop(key, None)

    def _remember(self, key: str, end: float) -> None:
        self._ends[key] = end
        while len(self._ends) > self.capacity:
            del self._ends[next(iter(self._ends))]
