"""Dead letters: a bounded FIFO of undeliverable messages, kept whole so they can be replayed.

Owns: the in-memory dead-letter list (count- and byte-bounded, oldest evicted) and its sequence
numbers. It must not send anything: ``record`` hands each new letter to the sink given at
construction (the plugins' dead-letter hook), and admin.py lists, shows, replays and purges them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from meshd.wire import protocol as P

__all__ = ["FRAME_OVERHEAD", "LETTER_OVERHEAD", "DeadLetters", "letter_cost"]

FRAME_OVERHEAD = 48
"""Bytes one kept frame costs beyond its length: the bytes object (33, rounded up by the
allocator) and its list slot. A letter of 10,000 two-byte frames costs 500 KB, not 20 KB."""

LETTER_OVERHEAD = 1024
"""Bytes one letter costs beyond its frames: its dict, the decoded header, the detail text."""


def letter_cost(frames: list[bytes]) -> int:
    """What a letter counts against the byte cap: close to the memory it really holds."""
    return LETTER_OVERHEAD + sum(len(f) for f in frames) + FRAME_OVERHEAD * len(frames)


class DeadLetters:
    """Bounded FIFO of undeliverable messages (oldest evicted), kept whole so they can be replayed.

    Bounded twice: by count (``dead_letter_capacity``) and by bytes (:func:`letter_cost`, which
    counts each frame's and each letter's overhead, not just payload bytes), so neither a burst of
    large payloads nor of many-frame garbage can grow the daemon without limit.
    """

    def __init__(self, capacity: int = 1024, max_bytes: int = 64 * 1024 * 1024,
                 sink: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.capacity = capacity
        self.sink = sink
        self.max_bytes = max_bytes
        self._items: dict[int, dict[str, Any]] = {}
        self._bytes = 0
        self.total = 0
        self.evicted = 0

    def record(self, reason: str, detail: str, frames: list[bytes],
               header: P.Header | Mapping[str, Any] | None, attempts: int = 0) -> dict[str, Any]:
        """Keep a dead letter and hand it to the sink: what every part that gives up on a message calls."""
        fields = header.fields if isinstance(header, P.Header) else header
        letter = self.add(reason, detail, frames, dict(fields) if fields else None, attempts)
        if self.sink is not None:
            self.sink(letter)
        return letter

    def add(self, reason: str, detail: str, frames: list[bytes] | None = None,
            header: dict[str, Any] | None = None, attempts: int = 0) -> dict[str, Any]:
        self.total += 1
        kept = list(frames or [])
        letter = {
            "seq": self.total,
            "at": time.time(),
            "reason": reason,
            "detail": detail[:500],
            "attempts": attempts,
            "header": header,
            "frames": kept,
        }
        self._items[self.total] = letter
        self._bytes += letter_cost(kept)
        while self._items and (len(self._items) > self.capacity or self._bytes > self.max_bytes):
            oldest = next(iter(self._items))
            self._bytes -= letter_cost(self._items.pop(oldest)["frames"])
            self.evicted += 1
        return letter

    @property
    def counted_bytes(self) -> int:
        """What the kept letters count against ``max_bytes``."""
        return self._bytes

    def list(self) -> list[dict[str, Any]]:
        return list(self._items.values())

    def get(self, seq: int) -> dict[str, Any] | None:
        return self._items.get(seq)

    def pop(self, seq: int) -> dict[str, Any] | None:
        letter = self._items.pop(seq, None)
        if letter is not None:
            self._bytes -= letter_cost(letter["frames"])
        return letter

    def purge(self) -> int:
        n = len(self._items)
        self._items.clear()
        self._bytes = 0
        return n
