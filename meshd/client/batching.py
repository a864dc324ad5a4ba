"""The client's batch format, both ways: coalescing outgoing messages, splitting incoming frame sets.

Owns: the typed :class:`BatchKey` (where a message goes and with which qos), the per-key queues of
the :class:`Batcher` and their bounds (``batch_max`` messages, about ``max_payload_bytes`` per
batch), the batch header the client builds, and :func:`split_incoming`, which turns one frame set
from the daemon into messages (a batch's inner headers inherit ``from``, ``to``, ``topic`` and ``prio``).

Must not touch: sockets, the event loop or futures. The batcher is given a ``push`` (hand frames
to the socket) and a ``schedule`` (run this at the end of the loop turn), so unit tests drive it
with lists. Payloads are already encoded bytes here; nothing in this module decodes them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from meshd.wire import protocol as P
from meshd.wire.protocol import FrameError, Kind

__all__ = ["BatchKey", "Batcher", "Incoming", "Route", "split_incoming", "to_agent", "to_topic"]

Item = tuple[dict[str, Any], bytes]
"""One message waiting to leave: its header (without ``from`` and destination) and payload bytes."""

ITEM_OVERHEAD = 128
"""Bytes counted per message on top of its payload when sizing a batch (inner header, framing)."""


Route = Literal["to", "topic"]
"""The header key that names a message's destination: ``to`` (an agent) or ``topic`` (a publish)."""

BatchKey = tuple[Route, str, int, int]
"""``(route, destination, qos, priority)``: messages with equal keys may leave as one batch (so a
batch never mixes priorities).

A plain typed tuple, built inline on the send path as ``(P.TO, name, qos)``: the batcher looks one
up per message, and a NamedTuple or frozen dataclass cost 0.3-2 us more per message (measured)
in construction and hashing, on a path that costs about 3 us in all.
"""


def to_agent(name: str, qos: int = 0, priority: int = P.DEFAULT_PRIORITY) -> BatchKey:
    """The key of messages to agent ``name``."""
    return (P.TO, name, qos, priority)


def to_topic(topic: str, qos: int = 0, priority: int = P.DEFAULT_PRIORITY) -> BatchKey:
    """The key of publications on ``topic``."""
    return (P.TOPIC, topic, qos, priority)


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
                 new_id: Callable[[], str] = P.new_id,
                 push_data: Callable[[list[bytes], int], None] | None = None) -> None:
        """``push_data(frames, priority)``, if given, takes the messages instead of ``push`` (the
        agent's send queue serves what waits lowest priority first, meshd/client/send_queue.py)."""
        if not 1 <= batch_max <= P.MAX_BATCH:
            raise ValueError(f"batch_max must be 1..{P.MAX_BATCH}")
        self.sender = sender
        self.batch_max = batch_max
        self.max_payload_bytes = max_payload_bytes
        self._push: Callable[[list[bytes]], None] = push
        self._push_data: Callable[[list[bytes], int], None] = \
            push_data or (lambda frames, _prio: push(frames))
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
        """Send everything queued, key by key: lower priorities first, then in the order the keys
        first queued (a stable sort, so FIFO holds within one priority)."""
        self._flush_scheduled = False
        keys = list(self._queues)
        if len(keys) > 1:
            keys.sort(key=_priority)
        for key in keys:
            self.flush_key(key)

    def flush_key(self, key: BatchKey) -> None:
        items = self._queues.pop(key, None)
        if items:
            for chunk in self.chunks(items):
                self._send(chunk, key)

    def chunks(self, items: list[Item]) -> list[list[Item]]:
        """Split into batches of at most ``batch_max`` messages and about ``max_payload_bytes``."""
        if len(items) <= self.batch_max and (sum([len(payload) for _, payload in items])
                                             + ITEM_OVERHEAD * len(items) <= self.max_payload_bytes):
            return [items]  # the usual case, at a third of the cost of the loop below
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
        dest_key, dest, qos, prio = key
        if len(chunk) == 1:
            header, payload = chunk[0]
            header[P.FROM] = self.sender
            header[dest_key] = dest
            if qos:
                header[P.QOS] = 1
            if prio != P.DEFAULT_PRIORITY:
                header[P.PRIO] = prio
            self._push_data(P.frames(header, payload), prio)
            return
        batch_id = self._new_id()
        kinds = {h[P.KIND] for h, _ in chunk}
        batch_header: dict[str, Any] = {P.KIND: Kind.BATCH, P.ID: batch_id, P.FROM: self.sender,
                                        dest_key: dest, P.COUNT: len(chunk), P.KINDS: sorted(kinds)}
        if qos:
            batch_header[P.QOS] = 1
        if prio != P.DEFAULT_PRIORITY:
            batch_header[P.PRIO] = prio  # the inner messages inherit it (split_incoming)
        if qos or Kind.PUBLISH in kinds:  # (a plain qos-0 send batch skips this pass)
            awaited = [h[P.ID] for h, _ in chunk if qos or h[P.KIND] == Kind.PUBLISH]
            self._on_batch(batch_id, awaited)  # resolved by the daemon's one answer for the batch
        self._push_data(P.frames(batch_header, P.pack_batch(chunk)), prio)


def _priority(key: BatchKey) -> int:
    return key[3]


_CHECKED_KINDS = frozenset({Kind.REPLY, Kind.ERROR, Kind.PROGRESS, Kind.REQUEST})
"""Inner kinds a batch header must declare in ``kinds``: daemons check those (answers go only to
their requester; requests are recorded so their answers can be checked)."""

Incoming = tuple[list[Item], str | None]
"""What one frame set from the daemon holds: its messages, and the qos-1 unit they form (the id to
acknowledge once every one of them was handled; None for qos 0). A plain tuple: one per frame set
received, on the receive path."""


def split_incoming(frames: list[bytes]) -> Incoming:
    """Decode ``[signature, header, payload]`` or a batch into messages. Raises FrameError.

    A batch's inner headers inherit ``from``, ``to`` and ``topic`` from the batch header
    (docs/PROTOCOL.md, batches); this is the one place the client does that.
    """
    messages, unit, _ = split_incoming_counted(frames)
    return messages, unit


def credit_of(frames: list[bytes]) -> int:
    """The credit a frame set took by its top-level header alone (0 if that does not parse): a
    frame set dropped as malformed still took what the daemon counted for it (§8.11)."""
    try:
        header = P.unpack_header(frames[1])
    except (FrameError, IndexError):
        return 0
    return P.credit_count(header.get(P.KIND), header.get(P.KINDS), header.get(P.COUNT))


def split_incoming_counted(frames: list[bytes]) -> tuple[list[Item], str | None, int]:
    """``split_incoming``, and the credit the frame set took (``P.credit_count`` of its top-level
    header, docs/PROTOCOL.md §8.11: what the daemon counted it as, whatever is inside)."""
    if len(frames) < 3:
        raise FrameError("too_few_frames", str(len(frames)))
    P.check_signature(frames[0])
    header = P.unpack_header(frames[1])
    unit = str(header[P.ID]) if header.get(P.QOS) == 1 and header.get(P.ID) else None
    kind = header[P.KIND]
    if kind != Kind.BATCH:
        return [(header, frames[2])], unit, 1 if kind in P.CREDIT_WORK_KINDS else 0
    credit = P.credit_count(kind, header.get(P.KINDS), header.get(P.COUNT))
    sender = header.get(P.FROM)
    to = header.get(P.TO)
    topic = header.get(P.TOPIC)
    prio = header.get(P.PRIO)
    pairs = P.split_batch(frames)
    kinds = header.get(P.KINDS)
    declared = frozenset(k for k in kinds if isinstance(k, str)) if isinstance(kinds, list) else frozenset()
    undeclared = False
    for inner, _ in pairs:  # one pass: every message of every batch received passes here
        inner[P.FROM] = sender  # the sender the daemon checked: an inner 'from' is never trusted
        if to is not None:
            inner.setdefault(P.TO, to)
        if topic is not None:
            inner.setdefault(P.TOPIC, topic)
        if prio is not None:
            inner[P.PRIO] = prio  # a batch never mixes priorities: the checked header's wins
        if inner[P.KIND] in _CHECKED_KINDS and inner[P.KIND] not in declared:
            undeclared = True
    if undeclared:
        # An answer the batch header did not declare was never checked by the sender's daemon
        # (it checks only declared ones, docs/PROTOCOL.md §4.2): drop those, keep the rest.
        pairs = [(h, p) for h, p in pairs if h[P.KIND] not in _CHECKED_KINDS or h[P.KIND] in declared]
        if not pairs:
            raise FrameError("batch_undeclared", "inner answers not declared in the batch header's 'kinds'")
    return pairs, unit, credit
