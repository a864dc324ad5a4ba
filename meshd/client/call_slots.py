"""The client's in-flight cap: how many of its own calls may await a daemon answer at once.

Owns: the count of calls on the wire that await an answer (requests, qos-1 sends, confirmed
publishes, control queries) and the queue, in order, of calls waiting for room. The daemon keeps
at most ``in_flight_max`` answers for a connection that is not reading (its register answer says
how many; PROTOCOL.md, "The answer lane"): a client that never has more calls out than that loses
no answer, so extra calls wait here instead of being sent and their answers dropped.

It also holds the requests' deadlines (``deadlines``, meshd/client/call_deadlines.py: one loop timer,
not one per request).

Must not touch: the socket, the futures of the calls themselves, the publish window (its own
part of the allowance, meshd/client/publish_window.py). The ``Agent`` (meshd/client/agent.py) owns one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from meshd.client.call_deadlines import CallDeadlines
from meshd.errors import DaemonUnreachable

__all__ = ["CallSlots"]


class CallSlots:
    """A FIFO counting semaphore whose size follows the daemon's allowance.

    ``try_take()`` is the fast path (no await when there is room and nobody waits); ``take()``
    waits in order; every taken slot is given back with ``give_back()`` once the call's answer
    came (or it failed or was cancelled).
    """

    def __init__(self, daemon: object = "meshd", size: int | None = None, *,
                 on_busy_change: Callable[[], None] | None = None) -> None:
        """``on_busy_change()`` is called when the first call goes out and when the last one is
        answered (the ``Agent`` gives its ``HandlerSlots.check_reading``)."""
        self.daemon = daemon  # named in the error a call that found no room raises
        #: None until the daemon said how many (the register call itself is never held back).
        self.size = size
        self.used = 0
        self.peak = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._on_busy_change = on_busy_change
        #: When each request awaiting its reply times out (the ``Agent`` adds and discards them).
        self.deadlines = CallDeadlines()

    def fit_daemon(self, in_flight_max: object, publish_window: int) -> None:
        """The register answer's ``in_flight_max``, less what the publish window may use."""
        if isinstance(in_flight_max, int) and in_flight_max > 0:
            self.resize(in_flight_max - publish_window)

    def resize(self, size: int) -> None:
        """The daemon's allowance for awaited calls; waiting calls go as far as it has room."""
        self.size = max(1, size)
        self._wake()

    def try_take(self) -> bool:
        """Take a slot if one is free and no earlier call waits for one."""
        waiters = self._waiters
        while waiters and waiters[0].done():
            del waiters[0]  # gave up waiting
        if waiters or (self.size is not None and self.used >= self.size):
            return False
        self._count_one()
        return True

    def _count_one(self) -> None:
        self.used += 1
        if self.used > self.peak:
            self.peak = self.used
        if self.used == 1 and self._on_busy_change is not None:
            self._on_busy_change()

    async def take(self, timeout: float) -> bool:
        """Wait, behind every earlier waiter, for a slot; False if none came within ``timeout``."""
        if self.try_take():
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
            return True
        except TimeoutError:
            if _granted(fut):
                return True  # granted just as the time ran out: use it
            fut.cancel()
            return False
        except asyncio.CancelledError:
            if _granted(fut):
                self.give_back()  # granted, but the caller went away: pass it on
            else:
                fut.cancel()
            raise
        finally:
            if not fut.done():
                fut.cancel()

    async def wait(self, timeout: float, late: BaseException | None = None) -> float:
        """Take a slot, waiting in order if none is free; the seconds waited. Raises ``late``
        (DaemonUnreachable if None) if none frees up within ``timeout``."""
        if self.try_take():
            return 0.0
        loop = asyncio.get_running_loop()
        start = loop.time()
        if not await self.take(timeout):
            raise late or DaemonUnreachable(f"meshd at {self.daemon} answered none of {self.used} "
                                            f"calls within {timeout:g} s")
        return loop.time() - start

    def give_back(self) -> None:
        self.used -= 1
        self._wake()
        if self.used == 0 and self._on_busy_change is not None:
            self._on_busy_change()

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters and (self.size is None or self.used < self.size):
            fut = waiters.popleft()
            if fut.done():
                continue  # it gave up waiting
            self._count_one()
            fut.set_result(None)

    def fail_waiting(self, exc: BaseException) -> None:
        """The agent closed: every waiting call raises ``exc``."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(exc)

    @property
    def waiting(self) -> int:
        return sum(1 for f in self._waiters if not f.done())


def _granted(fut: asyncio.Future[None]) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is None
