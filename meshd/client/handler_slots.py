"""The bound on an agent's running handlers, and the work that waits for one of their slots.

Owns: how many handlers that suspended (got a task) run at once, ``max_concurrent_handlers``
(a handler that finishes without suspending, the eager path of meshd/client/handlers.py, never
holds a slot); the queue of work messages (send, request, publication) that arrived while every
slot was taken, served lower priority first and FIFO within one (meshd/util/priority.py); reading
on while every slot is taken until ``park_max`` messages wait here (so a priority-0 message that
arrives behind a backlog overtakes what waits here), then pausing the agent's socket, so the rest
of the backlog stays in the daemon's
inbox where ``inbox_cap`` applies and senders get INBOX_FULL (docs/client.md, "Running handlers");
and, when the agent must keep reading because its own calls await answers, refusing qos-0 work
past ``park_max`` (INBOX_FULL, as the daemon would) and pausing anyway once qos-1 work (never
refused: it is at-least-once) fills ``parked_max``: what the agent's pipe and the daemon's inbox
hold together, which it may have to read through to reach an answer.

Must not touch: the handlers themselves (it is handed the ``Dispatcher``'s ``dispatch`` and is
told of each handler task through ``handler_started``), the socket (it is handed ``reading``),
the answers and the calls waiting for them (it only asks ``awaiting()``, and ``CallSlots`` calls
``check_reading`` when its first call goes out and its last one is answered). The ``Agent``
(meshd/client/agent.py) owns one and gives it these at construction.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from meshd.client.batching import BatchKey, to_agent
from meshd.errors import ValidationFailed
from meshd.transport import AGENT_RCVHWM
from meshd.util.priority import PriorityFifo, priority_of
from meshd.wire import protocol as P
from meshd.wire.protocol import Kind

__all__ = ["DEFAULT_MAX_CONCURRENT_HANDLERS", "HandlerSlots"]

log = logging.getLogger("meshd.client")

DEFAULT_MAX_CONCURRENT_HANDLERS = 64
"""Handlers of one agent that may be suspended (awaiting something) at once; more work waits in
the daemon's inbox (``inbox_cap``, 100 by default) until one finishes."""

DEFAULT_PARK_MAX = 100
"""Work kept while every slot is taken and the agent must read on, until the daemon's register
answer says its ``inbox_cap``."""

Work = tuple[dict[str, Any], bytes, "str | None"]
"""A work message: its header, payload bytes and qos-1 unit (None for qos 0)."""


def _work_priority(work: Work) -> int:
    return priority_of(work[0].get(P.PRIO))


class HandlerSlots:
    """Running handlers against their bound; parked work; the socket's reading paused or not."""

    DISPATCH_BUDGET = 0.001
    """Seconds of one loop turn spent starting parked work before the rest waits a turn."""

    def __init__(self, agent_name: str, limit: int, *,
                 dispatch: Callable[[dict[str, Any], bytes, str | None], None],
                 push: Callable[[list[bytes]], None],
                 enqueue: Callable[[BatchKey, dict[str, Any], bytes], None],
                 reading: Callable[[bool], None], awaiting: Callable[[], bool], read_ahead: int = 0) -> None:
        """``dispatch(header, payload, unit)`` runs a handler (``Dispatcher.dispatch``);
        ``awaiting()``: does the agent await answers (calls in flight, or publishes awaiting
        confirmation)? Then the socket must be read. ``reading(on)`` pauses or resumes it."""
        if limit < 1:
            raise ValidationFailed("max_concurrent_handlers must be at least 1")
        self.agent_name = agent_name
        self.limit = limit
        #: qos-0 work parked at most; past it, refused (the daemon's ``inbox_cap``).
        self.park_max = DEFAULT_PARK_MAX
        #: Work it reads ahead into ``parked`` (where priorities apply) before pausing, at least
        #: ``park_max``; more holds a backlog in this process's memory instead of the pipes.
        self.read_ahead = read_ahead
        #: Work parked at most, qos-1 included: the daemon's inbox and the agent's own pipe
        #: (``transport.AGENT_RCVHWM``), all of which may stand between the agent and an answer.
        self.parked_max = DEFAULT_PARK_MAX + AGENT_RCVHWM
        self.running = 0
        self.peak = 0
        self.peak_parked = 0
        #: Served lowest priority first, FIFO within one (meshd/util/priority.py).
        self.parked: PriorityFifo[Work] = PriorityFifo(_work_priority)
        #: When each parked message arrived (``time.monotonic()``), by the work item's identity
        #: (parked work is served by priority, not in arrival order): the consumer lag.
        self._parked_at: dict[int, float] = {}
        self.paused = False
        self.refused = 0
        #: when this loop turn began starting parked work (None: not yet), and whether some was
        #: left for the next turn (``_start_parked``)
        self._turn_start: float | None = None
        self._deferred = False
        self._dispatch = dispatch
        self._enqueue = enqueue
        self._push = push
        self._reading = reading
        self._awaiting = awaiting

    @property
    def full(self) -> bool:
        """Every slot is taken, or work waits for one: new work must wait too (arrival order)."""
        return self.running >= self.limit or bool(self.parked)

    def fit_daemon(self, inbox_cap: object) -> None:
        """The register answer said the daemon's inbox cap: park no more than that."""
        if isinstance(inbox_cap, int) and inbox_cap > 0:
            self.park_max = inbox_cap
            self.parked_max = inbox_cap + AGENT_RCVHWM

    # ------------------------------------------------------------------------ work in

    def offer(self, header: dict[str, Any], payload: bytes, unit: str | None) -> None:
        """A work message from the daemon: its handler runs now, or it waits for a slot."""
        if self.running < self.limit and not self.parked:
            self._dispatch(header, payload, unit)
            return
        # Past park_max, qos-0 work is refused only while the agent reads on for an answer; else
        # reading pauses at park_max, so at most the rest of one frame set (a batch) parks past it.
        if unit is None and len(self.parked) >= max(self.park_max, self.read_ahead) and self._awaiting():
            self.refuse(header, P.ErrorCode.INBOX_FULL,
                        f"inbox of {self.agent_name!r} is full ({self.limit} handlers running, "
                        f"{len(self.parked)} messages waiting)")
            return
        # qos-1 work is never refused (its daemon would hold it as still in the agent's hands,
        # docs/client.md): at parked_max the socket pauses instead.
        work = (header, payload, unit)
        self.parked.append(work)
        self._parked_at[id(work)] = time.monotonic()
        if len(self.parked) > self.peak_parked:
            self.peak_parked = len(self.parked)
        self.check_reading()

    def handler_started(self, task: asyncio.Task[Any]) -> None:
        """A handler suspended and got a task: it holds a slot until the task is done."""
        self.running += 1
        if self.running > self.peak:
            self.peak = self.running
        task.add_done_callback(self._handler_done)
        if self.running >= self.limit:
            self.check_reading()

    def _handler_done(self, _task: asyncio.Task[Any]) -> None:
        self.running -= 1
        if self._turn_start is None or not self._deferred:
            self._start_parked()
        self.check_reading()

    def _start_parked(self) -> None:
        """Start parked work in the free slots, lowest priority first, for at most
        ``DISPATCH_BUDGET`` seconds of this loop turn (an ``async def`` handler's first step runs
        inside the dispatch); the rest starts on the next turn, after the loop has read the
        socket, so urgent work that arrives behind a backlog waits for one short turn, not for
        every slot's next step (bench/routing_rows.py, priority rows)."""
        parked = self.parked
        while parked and self.running < self.limit:
            now = time.perf_counter()
            if self._turn_start is None:
                self._turn_start = now
                asyncio.get_running_loop().call_soon(self._new_turn)
            elif now - self._turn_start > self.DISPATCH_BUDGET:
                self._deferred = True
                return
            work = parked.popleft()
            self._parked_at.pop(id(work), None)
            header, payload, unit = work
            try:
                self._dispatch(header, payload, unit)
            except Exception:
                log.exception("agent %s: dropped a message that could not be handled", self.agent_name)

    def _new_turn(self) -> None:
        self._turn_start = None
        if self._deferred:
            self._deferred = False
            self._start_parked()
            self.check_reading()

    def lag(self) -> float:
        """Seconds the oldest message waiting for a handler slot has waited (0 when none waits):
        the consumer lag the agent's heartbeat reports (``lag_s``)."""
        return time.monotonic() - min(self._parked_at.values()) if self.parked and self._parked_at else 0.0

    def clear(self) -> None:
        """Forget what is parked (the agent closes: nothing parked runs now)."""
        self.parked.clear()
        self._parked_at.clear()

    def check_reading(self) -> None:
        """Pause the socket while every slot is taken and none of the agent's own calls awaits an
        answer; read otherwise (an answer may be what a running handler waits for), unless
        ``parked_max`` messages wait (qos-1 ones, never refused): then pause all the same, and a
        handler awaiting an answer behind them waits until its own time-out at worst."""
        parked = len(self.parked)
        ahead = max(self.park_max, self.read_ahead)
        pause = self.full and ((parked >= ahead and not self._awaiting())
                               or parked >= max(self.parked_max, ahead))
        if pause != self.paused:
            self.paused = pause
            self._reading(not pause)

    # ------------------------------------------------------------------------ refusals

    def cancel_parked(self, header: dict[str, Any]) -> bool:
        """A requester cancelled: a request of its that still waits for a slot never runs.
        Returns whether it was found (a request inside a parked batch is not: the caller
        remembers the cancel for when it starts)."""
        corr, sender = header.get(P.CORR), header.get(P.FROM)
        for item in self.parked:
            h, _, unit = item
            if unit is None and h.get(P.KIND) == Kind.REQUEST and h.get(P.FROM) == sender and \
                    (h.get(P.CORR) or h.get(P.ID)) == corr:
                self.parked.remove(item)
                self._parked_at.pop(id(item), None)
                self.refuse(h, P.ErrorCode.CANCELLED, "cancelled by the requester")
                self.check_reading()
                return True
        return False

    def refuse(self, header: dict[str, Any], code: str, message: str) -> None:
        """Tell whoever sent this work message that it will not run: a request's requester gets
        the error; a send or publication (never answered) is reported to the agent's daemon,
        which keeps it as a dead letter."""
        kind = header.get(P.KIND)
        retry_after = 0.1 if code == P.ErrorCode.INBOX_FULL else None
        if code == P.ErrorCode.INBOX_FULL:
            self.refused += 1
        msg_id = str(header.get(P.ID, ""))
        sender = str(header.get(P.FROM, ""))
        if kind == Kind.REQUEST:
            err = P.error_body(code, message, retry=retry_after is not None, retry_after=retry_after)
            reply = {P.KIND: Kind.ERROR, P.ID: P.new_id(), P.CORR: header.get(P.CORR) or msg_id,
                     P.ERROR: err}
            self._enqueue(to_agent(str(header.get(P.ORIGIN) or sender)), reply, b"")
            return
        # The daemon takes an agent's HANDLER_ERROR report on a send as a dead letter (a send is never
        # answered, so nothing else would show it failed); the report says why the handler never ran.
        err = P.error_body(P.ErrorCode.HANDLER_ERROR, f"{code}: {message}"[:500], remote_type=code)
        self._push(P.frames({P.KIND: Kind.ERROR, P.ID: P.new_id(), P.FROM: self.agent_name,
                             P.TO: sender, P.CORR: msg_id, P.TOPIC: header.get(P.TOPIC, ""),
                             P.ERROR: err}))
