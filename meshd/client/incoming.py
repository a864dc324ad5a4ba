"""The client's incoming side: what the Agent does with each frame set from its daemon.

Owns: splitting a frame set (``batching.split_incoming``) and handing its messages on: work to
the ``Dispatcher``, answers (``ok``, ``reply``, ``progress``) to the calls waiting for them,
error envelopes to those calls or to ``on_error`` (NAME_TAKEN, NOT_REGISTERED and DAEMON_STOPPING
honoured only from the agent's own daemon; NOT_REGISTERED and the DAEMON_STOPPING notice start
the ``ResendHold``'s hold and re-registration).

Must not touch: sending, the socket, the table of waiting calls beyond resolving an entry; the
``Agent`` (meshd/client.py) owns this part and the state it reads.
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any

from meshd.client.batching import split_incoming
from meshd.client.session import reregister
from meshd.errors import error_from_wire
from meshd.wire import protocol as P
from meshd.wire.payloads import decode_payload
from meshd.wire.protocol import FrameError, Kind

if TYPE_CHECKING:
    from meshd.client.agent import Agent

log = logging.getLogger("meshd.client")

_STATE_CHANGING = frozenset({P.ErrorCode.NAME_TAKEN, P.ErrorCode.NOT_REGISTERED,
                             P.ErrorCode.DAEMON_STOPPING})
"""Error codes that change this agent's state; honoured only from its own daemon."""
_WORK_KINDS = frozenset({Kind.SEND, Kind.REQUEST, Kind.PUBLISH})
"""Kinds that run a handler (the rest are answers and cancels)."""
ERROR_LOG_EVERY = 1000
"""Errors nobody handles (no ``on_error``) are logged once per code, then every this many."""


class Incoming:
    """Frame sets from the daemon, for one ``Agent``."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def on_frames(self, frames: list[bytes]) -> None:
        """One frame set from the daemon (called by the reactor): answers, errors, or work."""
        a = self.agent
        try:
            messages, unit = split_incoming(frames)
        except FrameError as exc:
            a._log_once.log(f"frame:{exc.reason}", "agent %s: dropped a frame set it cannot parse: %s",
                            a.name, exc)
            return
        if unit is not None:
            if a._dispatch.seen_unit(unit):
                return  # handled (or running) already: a daemon restart redelivered it
            a._dispatch.begin_unit(unit, len(messages))
        slots = a._handler_slots
        dispatch = a._dispatch.runner(unit)
        for header, payload in messages:
            try:
                if header[P.KIND] in _WORK_KINDS and slots.running < slots.limit and not slots.parked:
                    # Work with a free handler slot runs now, as ``HandlerSlots.offer`` would run
                    # it (one call less per message); the rest goes the general way.
                    dispatch(header, payload, unit)
                else:
                    self.on_message(header, payload, unit)
            except Exception:
                log.exception("agent %s: dropped a message that could not be handled", a.name)
        if a._handler_slots.full:
            a._handler_slots.check_reading()  # the last answer awaited may just have come

    def on_message(self, header: dict[str, Any], payload: bytes, unit: str | None = None) -> None:
        a = self.agent
        kind = header[P.KIND]
        if kind in _WORK_KINDS:
            a._handler_slots.offer(header, payload, unit)  # runs now, or waits for a handler slot
            return
        a._dispatch.unit_done(unit)
        if kind == Kind.OK:
            self.resolve(header.get(P.CORR), header, payload)
        elif kind == Kind.REPLY:
            fut = a._pending.get(str(header.get(P.CORR)))
            if fut is not None and not fut.done():
                fut.set_result(decode_payload(payload))
        elif kind == Kind.ERROR:
            self.on_error(header)
        elif kind == Kind.PROGRESS:
            cb = a._progress_cbs.get(str(header.get(P.CORR)))
            if cb is not None:
                try:
                    result = cb(str(header.get(P.NOTE, "working")))
                    if inspect.iscoroutine(result):
                        a._dispatch.spawn(result)
                except Exception:
                    log.exception("agent %s: on_progress callback raised", a.name)
        elif kind == Kind.CANCEL:
            a._dispatch.cancel(header)
            if a._handler_slots.parked:
                a._handler_slots.cancel_parked(header)

    def resolve(self, corr: Any, header: dict[str, Any], payload: bytes) -> None:
        a = self.agent
        members = a._batch_members.pop(str(corr), None)
        if members is not None:
            for member in members:
                self.resolve(member, header, payload)
            return
        fut = a._pending.get(str(corr))
        if fut is None:
            a._window.confirmed(str(corr))
            return
        if fut.done():
            return
        if P.COUNT in header:
            fut.set_result(header[P.COUNT])
        else:
            fut.set_result(decode_payload(payload) if payload else None)

    def on_error(self, header: dict[str, Any]) -> None:
        a = self.agent
        err = error_from_wire(header.get(P.ERROR))
        corr = header.get(P.CORR)
        if err.code == P.ErrorCode.INBOX_FULL and P.TOPIC in header and a._loop is not None:
            # A subscriber's inbox dropped our publications: the next publish waits retry_after.
            a._window.pause(a._loop.time() + min(err.retry_after or 0.1, 1.0))
            if a._window.held_notice(header):  # they wait at its daemon: a pause, nothing lost
                return
        ids = header.get(P.IDS)
        if isinstance(ids, list):
            targets: list[Any] = ids  # one envelope for a refused batch: one id per message
        else:
            members = a._batch_members.pop(str(corr), None) if corr else None
            targets = members if members is not None else [corr]
        if err.code in _STATE_CHANGING and not self.from_own_daemon(header, err.code):
            # Only our own daemon may evict us or tell us to register again (issue 8): another
            # agent (or another daemon) sending NAME_TAKEN must not make this agent give up its name.
            a.forged_errors += 1
            a._log_once.log(f"forged:{err.code}", "agent %s: ignored a %s error from %r (only its "
                            "own daemon may send that)", a.name, err.code, header.get(P.FROM))
            return
        if err.code == P.ErrorCode.INBOX_FULL and P.TOPIC not in header and a._loop is not None \
                and str(header.get(P.FROM, "")).startswith(P.DAEMON_PREFIX):
            # A receiver's inbox refused our qos-0 sends: the next sends to it wait a little
            # (meshd/client/send_pause.py). Only a daemon's word counts: agents cannot set that ``from``.
            a.send_pauses.refused(targets, err.retry_after, a._loop)
        unmatched = []
        for target in targets:
            fut = a._pending.get(str(target))
            if fut is not None and not fut.done():
                fut.set_exception(err)
            else:
                unmatched.append(target)
                a._window.confirmed(str(target))
        if err.code == P.ErrorCode.NAME_TAKEN and unmatched and not a._resend.reregistering:
            # Evicted: the same name was registered elsewhere during a partition and that
            # registration was earlier. This agent no longer owns its name; calls now raise.
            a.evicted = err
            log.warning("agent %s: %s", a.name, err.message)
        if err.code == P.ErrorCode.NOT_REGISTERED or (err.code == P.ErrorCode.DAEMON_STOPPING
                                                      and unmatched):
            if not a._closed and a.evicted is None:
                # The daemon restarted and forgot us, or is stopping (its notice): hold new qos-0
                # sends, register again and restore subscriptions; the qos-0 sends it refused go
                # again then (the others are reported below).
                unmatched = a._resend.hold(unmatched)
                if a._resend.start():  # one re-registration at a time
                    a._dispatch.spawn(a._resend.reregister(lambda: reregister(a), lambda: a._closed))
            unmatched = [t for t in unmatched if t is not None]
        if err.code == P.ErrorCode.CANCELLED:
            return  # the answer to our own cancel, after we stopped waiting: nothing to report
        for target in unmatched:
            a.errors_received += 1
            if a.on_error is not None:
                a.on_error(err, str(target) if target else None)
                continue
            logged = a._log_once.log(f"error:{err.code}", "agent %s: %s (%s; %d errors so far)",
                                     a.name, err.message, err.code, a.errors_received)
            if not logged and a.errors_received % ERROR_LOG_EVERY == 0:
                log.warning("agent %s: %s (%s; %d errors so far)", a.name, err.message, err.code,
                            a.errors_received)

    def from_own_daemon(self, header: dict[str, Any], code: str) -> bool:
        """Did our own daemon send this (``from`` is ``meshd@<its node id>``)? Agents cannot set it:
        the daemon refuses any ``from`` but the agent's registered name, and names have no '@'.
        NOT_REGISTERED is taken from any daemon: a restarted one may have a new node id."""
        a = self.agent
        sender = header.get(P.FROM)
        if not isinstance(sender, str) or not sender.startswith(P.DAEMON_PREFIX):
            return False
        return (code == P.ErrorCode.NOT_REGISTERED or a.node is None
                or sender == f"{P.DAEMON_PREFIX}{a.node}")
