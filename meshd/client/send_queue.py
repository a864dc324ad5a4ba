"""The agent's send queue: what its socket refuses waits here, data lowest priority first.

Owns: :class:`PrioritySendQueue`, the :class:`~meshd.transport.SendQueue` the client drives. Data
(``push_data``: the batcher's sends, requests and publishes, each with its priority) that waits
is served lowest priority number first, FIFO within one priority (so within one priority and one
receiver, as docs/PROTOCOL.md §8.10 says). Everything else (``push``: control calls, replies,
acks, heartbeats) keeps today's place: it leaves after all that was pushed before it and before
anything pushed after it (a barrier), so a register or an unregister is never overtaken, nor
overtakes, data. Empty, it sends at once as the plain queue does (the headline path).

Must not touch: the socket's options, the event loop beyond ``call_soon``, or decoding frames.
"""

from __future__ import annotations

from collections import deque

import zmq

from meshd.transport import SendQueue
from meshd.util.priority import LEVELS

__all__ = ["PrioritySendQueue"]

_Frames = list[bytes]


class _Segment:
    """What waits between two barriers: the barrier first, then data by priority."""

    __slots__ = ("barrier", "buckets", "count")

    def __init__(self, barrier: _Frames | None) -> None:
        self.barrier = barrier
        self.buckets: list[deque[_Frames]] | None = None
        self.count = 0 if barrier is None else 1

    def add(self, frames: _Frames, priority: int) -> None:
        if self.buckets is None:
            self.buckets = [deque() for _ in range(LEVELS)]
        self.buckets[priority].append(frames)
        self.count += 1

    def peek(self) -> _Frames:
        if self.barrier is not None:
            return self.barrier
        assert self.buckets is not None
        for bucket in self.buckets:
            if bucket:
                return bucket[0]
        raise IndexError("empty segment")

    def pop(self) -> None:
        self.count -= 1
        if self.barrier is not None:
            self.barrier = None
            return
        assert self.buckets is not None
        for bucket in self.buckets:
            if bucket:
                bucket.popleft()
                return


class PrioritySendQueue(SendQueue):
    """A :class:`SendQueue` whose waiting data is served by priority between barriers."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._segments: deque[_Segment] = deque()
        self._waiting = 0

    def __len__(self) -> int:
        return self._waiting

    def push(self, frames: _Frames) -> None:
        """A control frame set (a barrier): after everything waiting, before what follows."""
        if self._waiting:
            self._segments.append(_Segment(frames))
            self._waiting += 1
            return
        self._try(frames, None)

    def push_data(self, frames: _Frames, priority: int) -> None:
        """Data with its priority (0..9): now if nothing waits, else in priority order."""
        if self._waiting:
            segment = self._segments[-1]
            segment.add(frames, priority)
            self._waiting += 1
            return
        self._try(frames, priority)

    def _try(self, frames: _Frames, priority: int | None) -> None:
        try:
            self._send(frames)
        except zmq.Again:
            segment = _Segment(frames if priority is None else None)
            if priority is not None:
                segment.add(frames, priority)
            self._segments.append(segment)
            self._waiting += 1
            self.writable.clear()
            self._schedule_retry()
        self._reactor.kick(self._sock)

    def _retry(self) -> None:
        self._retry_scheduled = False
        if self._sock.closed:
            return
        send = self._send
        segments = self._segments
        while segments:
            segment = segments[0]
            if not segment.count:
                segments.popleft()
                continue
            try:
                send(segment.peek())
            except zmq.Again:
                self._schedule_retry()
                break
            segment.pop()
            self._waiting -= 1
        else:
            self.writable.set()
        self._reactor.kick(self._sock)

    def clear(self) -> None:
        self._segments.clear()
        self._waiting = 0
        self.writable.set()
