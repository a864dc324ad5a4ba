"""A bounded, numbered buffer of server-sent events, and the SSE wire form of one event.

Owns: :class:`EventBuffer` (the last N events of one stream, numbered from 1, so a client that
reconnects with ``Last-Event-ID`` gets what it missed while the buffer still holds it, and a gap
report for what fell out) and :func:`sse_frame`.
Must not touch: HTTP, sessions, the mesh.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["Event", "EventBuffer", "Gap", "sse_frame"]


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    name: str
    data: str  # JSON text


@dataclass(frozen=True, slots=True)
class Gap:
    """Events ``first``..``last`` (inclusive) fell out of the buffer before this reader got them."""

    first: int
    last: int

    @property
    def missed(self) -> int:
        return self.last - self.first + 1


class EventBuffer:
    """The last ``capacity`` events; readers wait for new ones without polling."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._events: deque[Event] = deque(maxlen=capacity)
        self._next_id = 1
        self._wake = asyncio.Event()
        self.closed = False

    @property
    def last_id(self) -> int:
        """The id of the newest event (0 before the first)."""
        return self._next_id - 1

    @property
    def oldest_id(self) -> int:
        """The id of the oldest event still held (``last_id + 1`` when empty)."""
        return self._events[0].id if self._events else self._next_id

    def append(self, name: str, data: Any) -> Event:
        event = Event(self._next_id, name, json.dumps(data, default=str, separators=(",", ":")))
        self._next_id += 1
        self._events.append(event)
        self._wake.set()
        self._wake = asyncio.Event()
        return event

    def since(self, after: int) -> tuple[list[Event], Gap | None]:
        """The events with an id above ``after``, and the gap before them if some fell out."""
        after = max(0, min(after, self.last_id))
        oldest = self.oldest_id
        gap = Gap(after + 1, oldest - 1) if after + 1 < oldest else None
        if not self._events or after >= self.last_id:
            return [], gap
        start = max(0, after + 1 - oldest)
        return list(self._events)[start:], gap

    async def wait(self, after: int, timeout: float) -> bool:
        """Wait until an event newer than ``after`` exists (or the buffer closes); False on timeout."""
        if self.last_id > after or self.closed:
            return True
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        """Wake every reader for good (the stream's owner is gone)."""
        self.closed = True
        self._wake.set()


def sse_frame(event: Event) -> bytes:
    """One event in the text/event-stream format (data is one JSON line)."""
    return f"id: {event.id}\nevent: {event.name}\ndata: {event.data}\n\n".encode()
