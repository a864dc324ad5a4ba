"""Open requests: which answers a local agent may send, so replies and errors cannot be forged.

Owns: the table of requests this daemon delivered to its local agents and that are still open,
keyed by ``(responder, correlation id)`` with the requester the answer must go to (else any agent
could answer a request it never got). ``Router.deliver_local`` records each request (single or
batched) it hands to an agent;
``Router.on_agent`` asks :meth:`OpenRequests.check` before an agent's ``reply``, ``error``,
``progress`` or delegated ``request`` (one with ``origin``) leaves: it passes only when it answers
a request this daemon saw go to that agent, addressed to that request's requester. A reply or an
error closes the entry (an answer goes once); progress and delegation keep it open.

Bounded: ``max_open_requests`` entries (config); when full the oldest entry is dropped (counted
as ``open_requests_evicted``), so a later answer to it is refused like an unknown one. An entry
expires at its request's deadline, or :data:`DEFAULT_OPEN_TTL` seconds after delivery when the
request carries none. It must not touch sockets, routing decisions or other daemons' state.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable

__all__ = ["DEFAULT_OPEN_TTL", "OpenRequests"]

DEFAULT_OPEN_TTL = 300.0
"""Seconds a delivered request without a deadline may still be answered."""


def _name(address: str) -> str:
    return address.partition("@")[0]


class OpenRequests:
    """Requests delivered to local agents and not answered yet (bounded, expiring)."""

    def __init__(self, capacity: int, stats: Counter[str],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self.stats = stats
        self._clock = clock
        # (responder name, corr) -> (requester name, expires at: this host's time.monotonic())
        self._open: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def is_open(self, responder: str, corr: str | None) -> bool:
        """Was request ``corr`` delivered to ``responder`` and not answered yet?"""
        return corr is not None and (responder, corr) in self._open

    def opened(self, responder: str, corr: str, requester: str, deadline: float | None) -> None:
        """A request with ``corr`` from ``requester`` was handed to local agent ``responder``."""
        now = self._clock()
        self._expire(now)
        key = (responder, corr)
        self._open.pop(key, None)
        while len(self._open) >= self.capacity:
            self._open.popitem(last=False)
            self.stats["open_requests_evicted"] += 1
        expires = deadline if deadline is not None else now + DEFAULT_OPEN_TTL
        self._open[key] = (_name(requester), expires)

    def check(self, responder: str, corr: str | None, to: str, *, closes: bool) -> str | None:
        """None if ``responder`` may answer request ``corr`` to ``to``; else why not.

        ``closes``: a reply or error (the answer goes once, the entry is removed).
        """
        if corr is None:
            return "an answer needs the request's 'corr'"
        key = (responder, corr)
        entry = self._open.get(key)
        if entry is None or entry[1] < self._clock():
            if entry is not None:
                del self._open[key]
            return f"no open request {corr!r} was delivered to {responder!r} (never, answered or expired)"
        if entry[0] != _name(to):
            return f"request {corr!r} came from {entry[0]!r}, not {_name(to)!r}"
        if closes:
            del self._open[key]
        return None

    def _expire(self, now: float) -> None:
        # Insertion order is close to expiry order (most requests share a timeout): drop expired
        # entries from the front; one that outlives its neighbours waits for the count bound.
        while self._open:
            key, (_, expires) = next(iter(self._open.items()))
            if expires >= now:
                return
            del self._open[key]
