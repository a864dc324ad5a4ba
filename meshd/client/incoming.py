"""The client's incoming side: what the Agent does with each frame set from its daemon.

Owns: splitting a frame set (``batching.split_incoming``) and handing its messages on: work to
the ``Dispatcher``, answers (``ok``, ``reply``, ``progress``) to the calls waiting for them,
error envelopes to those calls or to ``on_error`` (NAME_TAKEN, NOT_REGISTERED and DAEMON_STOPPING
honoured only from the agent's own daemon; NOT_REGISTERED and the DAEMON_STOPPING notice start
the ``ResendHold``'s hold and re-registration).

Must not touch: sending, the socket, the table of waiting calls beyond resolving an entry, the
``Agent``'s own state. The ``Agent`` (meshd/client/agent.py) owns this part and gives it, at
construction, the parts it hands messages to (``Dispatcher``, ``HandlerSlots``, ``PublishWindow``,
``SendPauses``, ``ResendHold``), the tables it shares with the ``Agent`` (the futures of waiting
calls, their progress callbacks, the members of each batch awaiting one answer: the same dict
objects, so the receive path pays no call per lookup) and an :class:`AgentEvents` bundle for
what it asks of the ``Agent`` and tells it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from meshd.client.batching import credit_of, split_incoming_counted
from meshd.client.handler_slots import HandlerSlots
from meshd.client.handlers import Dispatcher
from meshd.client.publish_window import PublishWindow
from meshd.client.resend import ResendHold
from meshd.client.send_pause import SendPauses
from meshd.errors import MeshError, error_from_wire
from meshd.util.logonce import LogOnce
from meshd.wire import protocol as P
from meshd.wire.payloads import decode_payload
from meshd.wire.protocol import FrameError, Kind

__all__ = ["ERROR_LOG_EVERY", "AgentEvents", "Incoming"]

log = logging.getLogger("meshd.client")

_STATE_CHANGING = frozenset({P.ErrorCode.NAME_TAKEN, P.ErrorCode.NOT_REGISTERED,
                             P.ErrorCode.DAEMON_STOPPING})
"""Error codes that change this agent's state; honoured only from its own daemon."""
_WORK_KINDS = frozenset({Kind.SEND, Kind.REQUEST, Kind.PUBLISH})
"""Kinds that run a handler (the rest are answers and cancels)."""
ERROR_LOG_EVERY = 1000
"""Errors nobody handles (no ``on_error``) are logged once per code, then every this many."""


@dataclass(frozen=True, slots=True)
class AgentEvents:
    """What the incoming side asks of its ``Agent`` and tells it (the daemon's ``PeerEvents``,
    meshd/mesh/peers.py, is the model). The ``Agent`` builds one from its own methods; none of
    these is called on the receive path of a message, only for errors."""

    #: The agent's event loop once it connected, else None (an INBOX_FULL pause needs its clock).
    loop: Callable[[], asyncio.AbstractEventLoop | None]
    #: Has the agent closed? Then nothing is registered again.
    closed: Callable[[], bool]
    #: The node id of the agent's own daemon (its register answer's; None before one).
    node: Callable[[], str | None]
    #: Why the agent was evicted (``Agent.evicted``), or None.
    evicted: Callable[[], MeshError | None]
    #: The agent is evicted: its name was registered elsewhere, earlier; its calls raise this now.
    evict: Callable[[MeshError], None]
    #: A state-changing error was ignored, not being from the agent's own daemon (counted).
    forged: Callable[[], None]
    #: An error that no waiting call takes: count it and hand it to ``on_error``; returns 0 when
    #: ``on_error`` took it, else the errors counted so far (the caller logs it).
    report: Callable[[MeshError, str | None], int]
    #: Register again and restore the subscriptions (``Session.reregister``).
    reregister: Callable[[], Awaitable[None]]


class Incoming:
    """Frame sets from the daemon, for one ``Agent``."""

    def __init__(self, name: str, *, dispatcher: Dispatcher, slots: HandlerSlots,
                 pending: dict[str, asyncio.Future[Any]], progress: dict[str, Callable[[str], Any]],
                 batch_members: dict[str, list[str]], window: PublishWindow, send_pauses: SendPauses,
                 resend: ResendHold, events: AgentEvents) -> None:
        """``pending``: the futures of the calls awaiting an answer, by message id; ``progress``:
        their ``on_progress`` callbacks; ``batch_members``: the ids one batch answer covers (the
        ``Batcher``'s ``on_batch`` fills it). All three are the ``Agent``'s own dicts, shared."""
        self.name = name
        self.log_once = LogOnce(log, capacity=64)
        #: Work messages read from the daemon (sends, requests, publications; a batch's each):
        #: the heartbeat reports it, and the daemon, which counts what it wrote, knows the lag.
        self.work_read = 0
        #: Credit mode (the register answer's ``credit``, docs/PROTOCOL.md §8.11): the daemon
        #: writes at most this many work messages ahead of what we said we read; 0: off.
        self.credit_window = 0
        #: the credit taken by what was read (``P.credit_count``, docs/PROTOCOL.md §8.11)
        self.credit_read = 0
        self._credit_told = 0
        #: sends a ``credit`` message with the read count (the Agent's)
        self.grant: Callable[[int], None] | None = None
        self._dispatcher = dispatcher
        self._slots = slots
        self._pending = pending
        self._progress = progress
        self._batch_members = batch_members
        self._window = window
        self._send_pauses = send_pauses
        self._resend = resend
        self._events = events

    def credit_opened(self, window: object) -> None:
        """The register answer's ``credit`` (absent: a daemon without credit mode, or it is off)."""
        self.credit_window = window if type(window) is int and window > 0 else 0
        self._credit_told = self.credit_read
        if self.credit_window and self.grant is not None:
            self.grant(self.credit_read)  # a register again: tell what was read so far

    def _count_credit(self, credit: int) -> None:
        """Credit mode: ``credit`` more was read; every half window read, the daemon is told."""
        self.credit_read += credit
        if self.grant is not None and self.credit_read - self._credit_told >= (self.credit_window + 1) // 2:
            self._credit_told = self.credit_read
            self.grant(self.credit_read)

    def on_frames(self, frames: list[bytes]) -> None:
        """One frame set from the daemon (called by the reactor): answers, errors, or work."""
        try:
            messages, unit, credit = split_incoming_counted(frames)
        except FrameError as exc:
            self.log_once.log(f"frame:{exc.reason}", "agent %s: dropped a frame set it cannot parse: %s",
                              self.name, exc)
            if self.credit_window:  # it took credit all the same: else the window shrinks for good
                self._count_credit(credit_of(frames))
            return
        if messages and messages[0][0].get(P.KIND) in _WORK_KINDS:
            self.work_read += len(messages)
        if credit and self.credit_window:
            # counted before anything may drop it (a duplicate unit), as the daemon counted it
            self._count_credit(credit)
        dispatcher = self._dispatcher
        if unit is not None:
            if dispatcher.seen_unit(unit):
                return  # handled (or running) already: a daemon restart redelivered it
            dispatcher.begin_unit(unit, len(messages))
        slots = self._slots
        dispatch = dispatcher.runner(unit)
        for header, payload in messages:
            try:
                if header[P.KIND] in _WORK_KINDS and slots.running < slots.limit and not slots.parked:
                    # Work with a free handler slot runs now, as ``HandlerSlots.offer`` would run
                    # it (one call less per message); the rest goes the general way.
                    dispatch(header, payload, unit)
                else:
                    self.on_message(header, payload, unit)
            except Exception:
                log.exception("agent %s: dropped a message that could not be handled", self.name)
        if slots.full:
            slots.check_reading()  # the last answer awaited may just have come

    def on_message(self, header: dict[str, Any], payload: bytes, unit: str | None = None) -> None:
        kind = header[P.KIND]
        if kind in _WORK_KINDS:
            self._slots.offer(header, payload, unit)  # runs now, or waits for a handler slot
            return
        self._dispatcher.unit_done(unit)
        if kind == Kind.OK:
            self.resolve(header.get(P.CORR), header, payload)
        elif kind == Kind.REPLY:
            fut = self._pending.get(str(header.get(P.CORR)))
            if fut is not None and not fut.done():
                fut.set_result(decode_payload(payload))
        elif kind == Kind.ERROR:
            self.on_error(header)
        elif kind == Kind.PROGRESS:
            cb = self._progress.get(str(header.get(P.CORR)))
            if cb is not None:
                try:
                    result = cb(str(header.get(P.NOTE, "working")))
                    if inspect.iscoroutine(result):
                        self._dispatcher.spawn(result)
                except Exception:
                    log.exception("agent %s: on_progress callback raised", self.name)
        elif kind == Kind.CANCEL:
            found = self._dispatcher.cancel(header)
            if not found and self._slots.parked:
                found = self._slots.cancel_parked(header)
            if not found:  # not started yet: inside a parked batch, or the cancel came first
                self._dispatcher.remember_cancel(header)

    def resolve(self, corr: Any, header: dict[str, Any], payload: bytes) -> None:
        members = self._batch_members.pop(str(corr), None)
        if members is not None:
            for member in members:
                self.resolve(member, header, payload)
            return
        fut = self._pending.get(str(corr))
        if fut is None:
            self._window.confirmed(str(corr))
            return
        if fut.done():
            return
        if P.COUNT in header:
            fut.set_result(header[P.COUNT])
        else:
            fut.set_result(decode_payload(payload) if payload else None)

    def on_error(self, header: dict[str, Any]) -> None:
        events, window, resend = self._events, self._window, self._resend
        err = error_from_wire(header.get(P.ERROR))
        sender = header.get(P.FROM)
        err.sender = sender if isinstance(sender, str) else None
        corr = header.get(P.CORR)
        loop = events.loop()
        if err.code == P.ErrorCode.INBOX_FULL and P.TOPIC in header and loop is not None:
            # A subscriber's inbox dropped our publications: the next publish waits retry_after.
            window.pause(loop.time() + min(err.retry_after or 0.1, 1.0))
            if window.held_notice(header):  # they wait at its daemon: a pause, nothing lost
                return
        ids = header.get(P.IDS)
        if isinstance(ids, list):
            targets: list[Any] = ids  # one envelope for a refused batch: one id per message
        else:
            members = self._batch_members.pop(str(corr), None) if corr else None
            targets = members if members is not None else [corr]
        if err.code in _STATE_CHANGING and not self.from_own_daemon(header, err.code):
            # Only our own daemon may evict us or tell us to register again: another
            # agent (or another daemon) sending NAME_TAKEN must not make this agent give up its name.
            events.forged()
            self.log_once.log(f"forged:{err.code}", "agent %s: ignored a %s error from %r (only its "
                              "own daemon may send that)", self.name, err.code, header.get(P.FROM))
            return
        if err.code == P.ErrorCode.INBOX_FULL and P.TOPIC not in header and loop is not None \
                and str(header.get(P.FROM, "")).startswith(P.DAEMON_PREFIX):
            # A receiver's inbox refused our qos-0 sends: the next sends to it wait a little
            # (meshd/client/send_pause.py). Only a daemon's word counts: agents cannot set that ``from``.
            self._send_pauses.refused(targets, err.retry_after, loop)
        unmatched = []
        # An agent's notice (a refusal of our send, relayed by its daemon) answers no call: it
        # must not fail one either (qos-0 send ids are guessable, unlike request ids).
        agent_notice = P.is_notice(header) and not str(sender or "").startswith(P.DAEMON_PREFIX)
        for target in targets:
            fut = None if agent_notice else self._pending.get(str(target))
            if fut is not None and not fut.done():
                fut.set_exception(err)
            else:
                unmatched.append(target)
                window.confirmed(str(target))
        if err.code == P.ErrorCode.NAME_TAKEN and unmatched and not resend.reregistering:
            # Evicted: the same name was registered elsewhere during a partition and that
            # registration was earlier. This agent no longer owns its name; calls now raise.
            events.evict(err)
            log.warning("agent %s: %s", self.name, err.message)
        if err.code == P.ErrorCode.NOT_REGISTERED or (err.code == P.ErrorCode.DAEMON_STOPPING
                                                      and unmatched):
            if not events.closed() and events.evicted() is None:
                # The daemon restarted and forgot us, or is stopping (its notice): hold new qos-0
                # sends, register again and restore subscriptions; the qos-0 sends it refused go
                # again then (the others are reported below).
                unmatched = resend.hold(unmatched)
                if resend.start():  # one re-registration at a time
                    self._dispatcher.spawn(resend.reregister(events.reregister, events.closed))
            unmatched = [t for t in unmatched if t is not None]
        if err.code == P.ErrorCode.CANCELLED:
            return  # the answer to our own cancel, after we stopped waiting: nothing to report
        for target in unmatched:
            so_far = events.report(err, str(target) if target else None)
            if not so_far:
                continue  # the agent's on_error took it
            logged = self.log_once.log(f"error:{err.code}", "agent %s: %s (%s; %d errors so far)",
                                       self.name, err.message, err.code, so_far)
            if not logged and so_far % ERROR_LOG_EVERY == 0:
                log.warning("agent %s: %s (%s; %d errors so far)", self.name, err.message, err.code,
                            so_far)

    def from_own_daemon(self, header: dict[str, Any], code: str) -> bool:
        """Did our own daemon send this (``from`` is ``meshd@<its node id>``)? Agents cannot set it:
        the daemon refuses any ``from`` but the agent's registered name, and names have no '@'.
        NOT_REGISTERED is taken from any daemon: a restarted one may have a new node id."""
        sender = header.get(P.FROM)
        if not isinstance(sender, str) or not sender.startswith(P.DAEMON_PREFIX):
            return False
        node = self._events.node()
        return code == P.ErrorCode.NOT_REGISTERED or node is None or sender == f"{P.DAEMON_PREFIX}{node}"
