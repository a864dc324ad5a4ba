"""The client's publish window: how many fire-and-forget publishes may await confirmation.

Owns: the ids of qos-0 publishes sent without ``reach=True`` that the daemon has not confirmed
yet (at most ``PUBLISH_WINDOW`` before ``publish`` waits for half of them), and the pause a
subscriber's INBOX_FULL asks for (when its daemon dropped our publications, or holds them:
``held_notice`` tells the two apart).

Must not touch: the socket, the batcher, the futures of awaited calls. The ``Agent``
(meshd/client/agent.py) owns one (composition) and tells it what was sent and confirmed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from meshd.errors import DaemonUnreachable
from meshd.wire import protocol as P

PUBLISH_YIELD_EVERY = 256
"""A qos-0 ``publish`` that finds room never suspends, so a plain publish loop would read a
subscriber daemon's pause notice only when its window fills; every this many publishes, one
yields one loop turn, so the notice stops the loop after at most this many more."""
PUBLISH_WINDOW = 4096
"""Publishes sent without ``reach=True`` that may await the daemon's confirmation at once; past
it, ``publish`` waits until half are confirmed (at most the control time-out), so a fast loop is
paced by its daemon and the table of unconfirmed ids stays bounded."""


class PublishWindow:
    """Unconfirmed publish ids, the event that says there is room again, and the INBOX_FULL pause."""

    def __init__(self, timeout: float, size: int = PUBLISH_WINDOW) -> None:
        self.timeout = timeout
        #: At most PUBLISH_WINDOW, and at most half the daemon's ``in_flight_max`` (the answers it
        #: keeps for a connection that is not reading): past that its confirmations would be dropped.
        self.size = size
        self.unconfirmed: set[str] = set()
        self.room = asyncio.Event()
        self.paused_until = 0.0  # loop time: a subscriber's inbox dropped (or holds) our publications
        #: Pauses asked for by a subscriber's daemon that held our publications (nothing lost).
        self.held_pauses = 0
        self._due = PUBLISH_YIELD_EVERY  # publishes left before one yields a loop turn

    def fit_daemon(self, in_flight_max: object) -> None:
        """The daemon's register answer said how many answers it keeps per connection."""
        if isinstance(in_flight_max, int) and in_flight_max > 0:
            self.size = max(1, min(PUBLISH_WINDOW, in_flight_max // 2))

    def full(self) -> bool:
        return len(self.unconfirmed) > self.size

    async def wait_room(self, daemon: object) -> None:
        """Wait until half the window is confirmed; DaemonUnreachable (naming ``daemon``) if not
        within ``timeout``."""
        self.room.clear()
        try:
            await asyncio.wait_for(self.room.wait(), self.timeout)
        except TimeoutError:
            self.unconfirmed.clear()  # they will not be confirmed now: do not wait for them again
            raise DaemonUnreachable(f"meshd at {daemon} did not confirm "
                                    f"{self.size} publishes within {self.timeout:g} s") from None

    def pause(self, until: float) -> None:
        """A subscriber's daemon said INBOX_FULL: the next publish waits until loop time ``until``."""
        self.paused_until = until

    async def wait_pause(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called before each qos-0 publish: every PUBLISH_YIELD_EVERY calls, yield a loop turn;
        and if a subscriber's daemon said INBOX_FULL for our publications, let it catch up (until
        the last such notice's pause ends: a daemon that holds our publications repeats it until
        they are out)."""
        self._due -= 1
        if self._due <= 0:
            self._due = PUBLISH_YIELD_EVERY
            await asyncio.sleep(0)  # read what came: a pause notice among it
        while self.paused_until:  # a notice that comes meanwhile makes the pause longer
            wait = self.paused_until - loop.time()
            self.paused_until = 0.0
            if wait > 0:
                await asyncio.sleep(wait)

    def held_notice(self, header: dict[str, Any]) -> bool:
        """Is this INBOX_FULL (with ``topic``) a daemon's word that our publications wait in a
        subscriber's hold (``held`` in its error map, docs/PROTOCOL.md §8.4), not lost? Counted in
        ``held_pauses``; the caller pauses either way, and reports only a loss to ``on_error``."""
        err = header.get(P.ERROR)
        held = err.get("held") if isinstance(err, dict) else None
        if not isinstance(held, int) or held <= 0:
            return False
        if not str(header.get(P.FROM, "")).startswith(P.DAEMON_PREFIX):
            return False  # only a daemon's word counts: an agent cannot silence a loss report
        self.held_pauses += 1
        return True

    def confirmed(self, msg_id: str) -> None:
        """The daemon confirmed (or refused) publish ``msg_id``: it no longer uses the window."""
        unconfirmed = self.unconfirmed
        if not unconfirmed:
            return
        unconfirmed.discard(msg_id)
        if len(unconfirmed) <= self.size // 2:
            self.room.set()
