"""The client's per-destination send pause: a plain qos-0 ``send`` loop backs off on INBOX_FULL.

Owns: for each destination whose daemon refused one of our qos-0 sends with INBOX_FULL, the
pause the next sends to it wait (a gate that opens at a loop time; waiters resume in the order
they came), the pause's length (``SEND_PAUSE_MIN``, doubling while refusals continue right
after a pause, at most ``retry_after`` or ``SEND_PAUSE_MAX``; back to the minimum after a quiet
spell), and the count of pauses begun (``started``). At most ``SEND_PAUSE_DESTINATIONS``
destinations are remembered.

Also owns the destinations of the last qos-0 sends by message id (``SEND_PAUSE_IDS``, two
generations), which is how a refusal (naming only ids) names a destination.

Must not touch: the socket, the batcher, the resend hold, the futures of awaited calls. The ``Agent``
(meshd/client/agent.py) owns one (composition): ``Agent.send`` tells it each qos-0 send
(:meth:`SendPauses.sent`: a dict store and a counter) and awaits :meth:`SendPauses.before_send`
only while a pause is active or once every ``SEND_YIELD_EVERY`` sends; ``Incoming.on_error``
(meshd/client/incoming.py) calls :meth:`SendPauses.refused`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

SEND_PAUSE_MIN = 0.002
"""The first pause (seconds) of sends to a destination after its inbox refused one of them."""
SEND_PAUSE_MAX = 0.1
"""The longest pause, when the refusal names no ``retry_after`` (the daemon's is 0.1 s)."""
SEND_YIELD_EVERY = 256
"""A qos-0 ``send`` that finds room at once never suspends, so a plain send loop would never let
the event loop read a refusal; every this many sends, one suspends for one loop turn."""
SEND_PAUSE_IDS = 4096
"""The destinations of the last qos-0 sends are remembered by id, in two generations of this many
(so between this many and twice as many), to know whose inbox a refusal names."""
SEND_PAUSE_DESTINATIONS = 1024
"""Destinations whose last pause is remembered (so the next one can be longer); past it, those
not paused now are forgotten."""


class _Pause:
    __slots__ = ("count", "gate", "length", "until")

    def __init__(self) -> None:
        self.until = 0.0  # loop time the last pause ended (or ends)
        self.length = 0.0
        self.count = 0  # pauses begun
        self.gate: asyncio.Event | None = None  # set while paused; opens at ``until``


class SendPauses:
    """The pauses of qos-0 sends to destinations whose inbox is full."""

    def __init__(self) -> None:
        self._by_dest: dict[str, _Pause] = {}
        #: Pauses going on now: ``Agent.send`` looks a destination up only while this is non-zero.
        self.active = 0
        #: Pauses begun since the agent started (how often a full inbox slowed a send loop).
        self.started = 0
        #: Sends left before the next one yields a loop turn (``Agent.send`` counts it down).
        self.due = SEND_YIELD_EVERY
        self._sent: dict[str, str] = {}  # message id -> destination, this generation
        self._sent_before: dict[str, str] = {}  # the generation before

    def sent(self, msg_id: str, to: str) -> bool:
        """A qos-0 send to ``to`` is about to go: remember where, for a refusal of it. True if the
        caller must await :meth:`before_send` first (a pause is active, or a loop turn is due)."""
        sent = self._sent
        sent[msg_id] = to
        if len(sent) >= SEND_PAUSE_IDS:
            self._sent_before, self._sent = sent, {}
        self.due -= 1
        return self.active != 0 or self.due <= 0

    def refused(self, targets: Iterable[Any], retry_after: float | None,
                loop: asyncio.AbstractEventLoop) -> None:
        """A daemon refused the qos-0 sends ``targets`` (message ids) with INBOX_FULL: pause the
        sends to each of their destinations not paused already."""
        for target in targets:
            to = self._sent.get(str(target)) or self._sent_before.get(str(target))
            if to is not None:
                self._pause(to, retry_after, loop)

    def _pause(self, to: str, retry_after: float | None, loop: asyncio.AbstractEventLoop) -> None:
        pause = self._by_dest.get(to)
        now = loop.time()
        if pause is None:
            if len(self._by_dest) >= SEND_PAUSE_DESTINATIONS:
                self._forget_idle()
                if len(self._by_dest) >= SEND_PAUSE_DESTINATIONS:
                    return  # every remembered destination is paused now: bounded, no new one
            pause = self._by_dest[to] = _Pause()
        elif pause.gate is not None:
            return  # paused already: this refusal is of a send made before the pause began
        longest = min(retry_after or SEND_PAUSE_MAX, 1.0)
        if pause.length and now - pause.until < 2 * pause.length:
            pause.length = min(pause.length * 2, longest)  # refused again soon after: still behind
        else:
            pause.length = min(SEND_PAUSE_MIN, longest)  # the first refusal after a quiet spell
        pause.until = now + pause.length
        pause.gate = asyncio.Event()
        self.active += 1
        self.started += 1
        pause.count += 1
        loop.call_at(pause.until, self._open, pause)

    def _open(self, pause: _Pause) -> None:
        gate, pause.gate = pause.gate, None
        if gate is not None:
            self.active -= 1
            gate.set()  # the waiters resume in the order they began to wait

    def _forget_idle(self) -> None:
        self._by_dest = {to: p for to, p in self._by_dest.items() if p.gate is not None}

    def paused(self, to: str) -> bool:
        """Are sends to ``to`` paused now?"""
        pause = self._by_dest.get(to)
        return pause is not None and pause.gate is not None

    def pauses_of(self, to: str) -> int:
        """How many pauses sends to ``to`` have had (0 if it is no longer remembered)."""
        pause = self._by_dest.get(to)
        return pause.count if pause is not None else 0

    async def before_send(self, to: str) -> None:
        """Called by ``Agent.send`` when ``due`` ran out or a pause is active: yield one loop turn
        (so refusals that came meanwhile are read), then wait while sends to ``to`` are paused."""
        if self.due <= 0:
            self.due = SEND_YIELD_EVERY
            await asyncio.sleep(0)
        await self.wait(to)

    async def wait(self, to: str) -> None:
        """Wait while sends to ``to`` are paused (returns at once if they are not)."""
        pause = self._by_dest.get(to)
        if pause is not None and pause.gate is not None:
            await pause.gate.wait()

    def clear(self) -> None:
        """The agent closed: open every gate now (the counts stay) and forget the ids sent."""
        for pause in self._by_dest.values():
            self._open(pause)
        self._sent, self._sent_before = {}, {}
