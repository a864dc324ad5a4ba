"""The deadlines of a client's requests, on one loop timer instead of one timer per request.

A ``loop.call_later`` per request is a ``TimerHandle`` pushed on the loop's heap, cancelled when
the reply comes, and swept from the heap later: a few microseconds on every round trip of a plain
``await me.request(...)`` loop, where the timer almost never fires. Here a request's deadline is a
dict entry (set, then popped with the reply); one timer stays armed for the earliest deadline, and
re-arms only when a new deadline is earlier than the armed one or when it fires. In a plain loop
with one timeout the timer fires about once per timeout, whatever the number of requests.

Owns: the deadlines and the one timer. Must not touch: the futures (``expire`` callbacks given by
the ``Agent``, meshd/client/agent.py, fail them), the socket, the call slots.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

__all__ = ["CallDeadlines"]

_EARLY = 1e-6
"""A deadline this close counts as passed when the timer fires (the loop may run a timer a clock
tick early); never later than asked."""


class CallDeadlines:
    """Deadlines by call id; ``expire(*args)`` runs when one passes before it was discarded."""

    def __init__(self) -> None:
        self._due: dict[str, tuple[float, Callable[..., None], tuple[Any, ...]]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at = math.inf

    def __len__(self) -> int:
        return len(self._due)

    def add(self, loop: asyncio.AbstractEventLoop, key: str, delay: float,
            expire: Callable[..., None], *args: Any) -> None:
        """``expire(*args)`` in ``delay`` seconds unless ``discard(key)`` comes first."""
        when = loop.time() + delay
        self._due[key] = (when, expire, args)
        if when < self._armed_at:
            self._arm(loop, when)

    def discard(self, key: str) -> None:
        """The call was answered (or failed, or was cancelled): its deadline no longer matters."""
        self._due.pop(key, None)

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self._fire, loop)
        self._armed_at = when

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._armed_at = math.inf
        now = loop.time() + _EARLY
        passed = [key for key, (when, _, _) in self._due.items() if when <= now]
        for key in passed:
            entry = self._due.pop(key, None)
            if entry is not None:
                entry[1](*entry[2])
        if self._due:
            self._arm(loop, min(when for when, _, _ in self._due.values()))
