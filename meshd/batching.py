"""The client's batch format, both ways: coalescing outgoing messages, splitting incoming frame sets.

Owns: the typed :class:`BatchKey` (where a message goes and with which qos), the per-key queues of
the :class:`Batcher` and their bounds (``batch_max`` messages, about ``max_payload_bytes`` per
batch), the batch header the client builds, and :func:`split_incoming`, which turns one frame set
from the daemon into messages (a batch's inner headers inherit ``from``, ``to`` and ``topic``).

Must not touch: sockets, the event loop or futures. The batcher is given a ``push`` (hand frames
to the socket) and a ``schedule`` (run this at the end of the loop turn), so unit tests drive it
with lists. Payloads are already encoded bytes here; nothing in this module decodes them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import protocol as P
from .protocol import FrameError, Kind

__all__ = ["BatchKey", "Batcher", "Incoming", "Route", "split_incoming"]

Item = tuple[dict[str, Any], bytes]
"""One message waiting to leave: its header (without ``from`` and destination) and payload bytes."""

ITEM_OVERHEAD = 128
"""Bytes counted per message on top of its payload when sizing a batch (inner header, framing)."""


class Route(enum.Enum):
    """Which header key names a message's destination."""

    TO = P.TO  # an agent (send, request, reply, error, progress, cancel)
    TOPIC = P.TOPIC  # a topic (publish)


@dataclass(frozen=True, slots=True)
class BatchKey:
    """Messages with equal keys may leave as one batch: same destination, same qos."""

    route: Route
    dest: str
    qos: int = 0

    @classmethod
    def to(cls, agent: str, qos: int = 0) -> BatchKey:
        return cls(Route.TO, agent, qos)

    @classmethod
    def topic(cls, topic: str, qos: int = 0) -> BatchKey:
        return cls(Route.TOPIC, topic, qos)


class Batcher:
    """Adaptive batching: an idle client's message leaves at once; what piles up behind it within
    the loop turn (or while the socket is busy) leaves as batches of at most ``batch_max``.

    Order is kept per key (FIFO per sender/receiver pair). ``on_batch(batch_id, ids)`` is told
    which message ids one batch answer covers (qos-1 messages and publishes, whose callers await
    the daemon's one ``ok`` for the batch).
    """

    def __init__(self, sender: str, *, batch_max: int, max_payload_bytes: int,
                 push: Callable[[list[bytes]], None], schedule: Callable[[Callable[[], None]], None],
                 busy: Callable[[], bool], on_batch: Callable[[str, list[str]], None],
                 new_id: Callable[[], str] = P.new_id) -> None:
        if not 1 <= batch_max <= P.MAX_BATCH:
            raise ValueError(f"batch_max must be 1..{P.MAX_BATCH}")
        self.sender = sender
        self.batch_max = batch_max
        self.max_payload_bytes = max_payload_bytes
        self._push = push
        self._schedule = schedule
        self._busy = busy
        self._on_batch = on_batch
        self._new_id = new_id
        self._queues: dict[BatchKey, list[Item]] = {}
        self._flush_scheduled = False

    @property
    def queued(self) -> int:
        """Messages waiting in this batcher (not yet handed to the socket)."""
        return sum(len(q) for q in self._queues.values())

    def enqueue(self, key: BatchKey, header: dict[str, Any], payload: bytes) -> None:
        """Queue one message for ``key``; it leaves now if the client is idle, else by the turn's end."""
        queue = self._queues.get(key)
        if queue is None:
            if not self._flush_scheduled and not self._busy():
                # Idle: this message leaves now (no added latency). Whatever follows in this
                # loop turn queues behind it and leaves as a batch at the end of the turn.
                self._send([(header, payload)], key)
                self._flush_scheduled = True
                self._schedule(self.flush)
                return
            queue = self._queues[key] = []
        queue.append((header, payload))
        if len(queue) >= self.batch_max:
            self.flush_key(key)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._schedule(self.flush)

    def flush(self) -> None:
        """Send everything queued, key by key in the order the keys first queued."""
        self._flush_scheduled = False
        for key in list(self._queues):
            self.flush_key(key)

    def flush_key(self, key: BatchKey) -> None:
        items = self._queues.pop(key, None)
        if items:
            for chunk in self.chunks(items):
                self._send(chunk, key)

    def chunks(self, items: list[Item]) -> list[list[Item]]:
        """Split into batches of at most ``batch_max`` messages and about ``max_payload_bytes``."""
        if len(items) == 1:
            return [items]
        chunks: list[list[Item]] = []
        current: list[Item] = []
        size = 0
        for item in items:
            n = len(item[1]) + ITEM_OVERHEAD
            if current and (len(current) >= self.batch_max or size + n > self.max_payload_bytes):
                chunks.append(current)
                current, size = [], 0
            current.append(item)
            size += n
        if current:
            chunks.append(current)
        return chunks

    def _send(self, chunk: list[Item], key: BatchKey) -> None:
        dest_key = key.route.value
        if len(chunk) == 1:
            header, payload = chunk[0]
            header[P.FROM] = self.sender
            header[dest_key] = key.dest
            if key.qos:
                header[P.QOS] = 1
            self._push([P.SIGNATURE, P.pack(header), payload])
            return
        batch_id = self._new_id()
        batch_header: dict[str, Any] = {P.KIND: Kind.BATCH, P.ID: batch_id, P.FROM: self.sender,
                                        dest_key: key.dest, P.COUNT: len(chunk)}
        if key.qos:
            batch_header[P.QOS] = 1
        awaited = [h[P.ID] for h, _ in chunk if key.qos or h[P.KIND] == Kind.PUBLISH]
        if awaited:  # resolved by the daemon's one answer for the whole batch
            self._on_batch(batch_id, awaited)
        self._push([P.SIGNATURE, P.pack(batch_header), P.pack_batch(chunk)])


@dataclass(frozen=True, slots=True)
class Incoming:
    """What one frame set from the daemon holds: its messages, and the qos-1 unit they form.

    ``unit`` is the id to acknowledge once every message of it was handled (None: qos 0).
    """

    messages: list[Item]
    unit: str | None
    batched: bool


def split_incoming(frames: list[bytes]) -> Incoming:
    """Decode ``[signature, header, payload]`` or a batch into messages. Raises FrameError.

    A batch's inner headers inherit ``from``, ``to`` and ``topic`` from the batch header
    (docs/PROTOCOL.md, batches); this is the one place the client does that.
    """
    if len(frames) < 3:
        raise FrameError("too_few_frames", str(len(frames)))
    P.check_signature(frames[0])
    header = P.unpack_header(frames[1])
    unit = str(header[P.ID]) if header.get(P.QOS) == 1 and header.get(P.ID) else None
    if header[P.KIND] != Kind.BATCH:
        return Incoming([(header, frames[2])], unit, False)
    sender = header.get(P.FROM)
    to = header.get(P.TO)
    topic = header.get(P.TOPIC)
    pairs = P.split_batch(frames)
    for inner, _ in pairs:
        inner.setdefault(P.FROM, sender)
        if to is not None:
            inner.setdefault(P.TO, to)
        if topic is not None:
            inner.setdefault(P.TOPIC, topic)
    return Incoming(pairs, unit, True)
