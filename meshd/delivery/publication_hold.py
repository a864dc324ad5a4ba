"""The subscriber's daemon holds publications a full inbox could not take yet, instead of dropping them.

Owns: per local subscriber connection, the publications (ZeroMQ messages: one publication or a
publishing batch) that its inbox (``inbox_cap``, the agent ROUTER's high-water mark) refused, in
the order they came, bounded by ``publish_hold_max`` publications per connection and
``publish_hold_max_bytes`` over all connections; sending them, lower priority first and oldest
first within one, as the subscriber
reads (a timer every ``HOLD_FLUSH_S`` while any wait, backing off to ``HOLD_FLUSH_MAX_S`` while
none goes out, and before each newer publication to that connection, so a newer one never
overtakes a held one); forgetting what waits for a connection that is gone; whose publications
wait (``held_from``; ``reading_publishers``: those held for a subscriber whose hold began or
last moved recently); and the counters ``publish_held`` (publications that waited here),
``publish_hold_delivered``, ``publish_hold_discarded`` (their subscriber left) and
``publish_hold_peak`` (the most publications one connection had waiting).

Must not touch: the decision to drop and the notices (gap notice to the subscriber, INBOX_FULL to
the publisher): meshd/delivery/publications.py asks :meth:`PublicationHold.offer` and does those itself when
it answers False. Answers to the agent (``AgentLink``'s answer lane) go first: nothing held is
sent to a connection while answers wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

import zmq

from meshd.util.priority import DEFAULT_PRIORITY, PriorityFifo

if TYPE_CHECKING:
    from meshd.delivery.local_agents import AgentLink

__all__ = ["HOLD_FLUSH_MAX_S", "HOLD_FLUSH_S", "PublicationHold"]

HOLD_FLUSH_S = 0.002
"""While publications wait, the held ones are offered to their inboxes again this often..."""
HOLD_FLUSH_MAX_S = 0.05
"""...and, while no inbox takes any (subscribers that read nothing), doubling up to this, so that
stuck subscribers cost a failed send each per 50 ms, not per 2 ms."""


_Held = tuple[list[bytes], int, int, str, int]
"""(frames, publications, bytes, publisher, priority)"""


def _priority(item: _Held) -> int:
    return item[4]


class _Waiting:
    __slots__ = ("count", "items", "progress", "publishers")

    def __init__(self, now: float) -> None:
        # served lower priority first, in arrival order within one
        self.items: PriorityFifo[_Held] = PriorityFifo(_priority)
        self.count = 0  # publications in ``items``
        self.publishers: Counter[str] = Counter()  # publisher -> its publications in ``items``
        self.progress = now  # monotonic: the hold began, or last sent one out


class PublicationHold:
    """Held publications per subscriber connection (routing id), bounded."""

    def __init__(self, link: AgentLink, stats: Counter[str], *, per_subscriber_max: int,
                 max_bytes: int, connected: Callable[[bytes], bool]) -> None:
        self.link = link
        self.stats = stats
        self.per_subscriber_max = per_subscriber_max
        self.max_bytes = max_bytes
        self._connected = connected  # is this routing id still a local agent's connection?
        self._waiting: dict[bytes, _Waiting] = {}
        self.bytes = 0  # held over all connections (frame bytes)
        self._timer: asyncio.TimerHandle | None = None
        self._interval = HOLD_FLUSH_S

    def waiting(self, rid: bytes) -> int:
        """Publications held for connection ``rid`` (0: none, newer ones may go straight out)."""
        waiting = self._waiting.get(rid)
        return waiting.count if waiting is not None else 0

    def offer(self, rid: bytes, msg: list[bytes], publications: int, publisher: str = "",
              priority: int = DEFAULT_PRIORITY) -> bool:
        """Hold ``msg`` (``[signature, header, payload]``, ``publications`` of them, from
        ``publisher``) for ``rid`` behind what waits already with its ``priority`` or a lower
        number. False if that would pass a bound: the caller drops it."""
        size = sum(map(len, msg))
        waiting = self._waiting.get(rid)
        held = waiting.count if waiting is not None else 0
        if held + publications > self.per_subscriber_max or self.bytes + size > self.max_bytes:
            return False
        if waiting is None:
            if not self._waiting:
                self._interval = HOLD_FLUSH_S  # a new episode: look soon
            waiting = self._waiting[rid] = _Waiting(time.monotonic())
        waiting.items.append(([rid, *msg], publications, size, publisher, priority))
        waiting.count += publications
        waiting.publishers[publisher] += publications
        self.bytes += size
        self.stats["publish_held"] += publications
        if waiting.count > self.stats["publish_hold_peak"]:
            self.stats["publish_hold_peak"] = waiting.count
        self._schedule()
        return True

    def flush_one(self, rid: bytes) -> bool:
        """Send what waits for ``rid`` as far as its inbox takes it; True if nothing waits now."""
        waiting = self._waiting.get(rid)
        if waiting is None:
            return True
        if self.link.has_backlog(rid):
            return False  # answers first
        send = self.link.send_now
        items = waiting.items
        try:
            while items:
                frames, publications, size, publisher, _ = items.peek()
                send(frames)
                items.popleft()
                waiting.count -= publications
                waiting.publishers[publisher] -= publications
                self.bytes -= size
                self.stats["publish_hold_delivered"] += publications
                waiting.progress = 0.0  # stamped below (one clock read per flush)
        except zmq.Again:
            if not waiting.progress:
                waiting.progress = time.monotonic()
            return False
        except zmq.ZMQError:
            self._discard(rid)  # the connection is gone
            return True
        finally:
            self.link.kick()
        del self._waiting[rid]
        return True

    def flush(self) -> None:
        """The timer: offer every connection's held publications again; forget those gone."""
        self._timer = None
        delivered = self.stats["publish_hold_delivered"]
        for rid in list(self._waiting):
            if not self._connected(rid):
                self._discard(rid)
            else:
                self.flush_one(rid)
        if self.stats["publish_hold_delivered"] > delivered:
            self._interval = HOLD_FLUSH_S
        else:  # no inbox took any: look less often (a newer publication still tries at once)
            self._interval = min(self._interval * 2, HOLD_FLUSH_MAX_S)
        if self._waiting:
            self._schedule()

    def _discard(self, rid: bytes) -> None:
        waiting = self._waiting.pop(rid, None)
        if waiting is not None:
            self.stats["publish_hold_discarded"] += waiting.count
            self.bytes -= sum(item[2] for item in waiting.items)

    def held_from(self, publisher: str) -> int:
        """Publications of ``publisher`` held, for all subscribers."""
        return sum(waiting.publishers[publisher] for waiting in self._waiting.values())

    def reading_publishers(self, within: float) -> set[str]:
        """Publishers with publications held for a subscriber that is reading: its hold began,
        or last sent one out, less than ``within`` seconds ago (one that reads nothing drops out
        of this after ``within``, so it cannot keep its publishers paused for good)."""
        since = time.monotonic() - within
        return {publisher for waiting in self._waiting.values() if waiting.progress >= since
                for publisher, n in waiting.publishers.items() if n > 0}

    def _schedule(self) -> None:
        if self._timer is None:
            with contextlib.suppress(RuntimeError):  # no loop: nothing to flush later
                self._timer = asyncio.get_running_loop().call_later(self._interval, self.flush)
