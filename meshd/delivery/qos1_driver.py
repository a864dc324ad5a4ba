"""The qos-1 machine's I/O: feeds it events from the daemon and performs the actions it returns.

Owns: the group-commit schedule (one ``Qos1.flush`` per loop turn when ``needs_flush``), the
list of what waits for the next commit (a qos-1 publication's confirmation), and the meaning of
each action: ``Confirm`` -> ``ok`` on the agent link, ``Attempt`` -> ``Router.route``,
``SendAcks`` -> an ``ack`` to the origin daemon (or ourselves), ``Acked`` -> counters and
outcomes, ``GiveUp`` -> a dead letter and ``UNDELIVERABLE`` to the sender. The machine itself
(meshd/qos1/machine.py) never touches a socket; routing, agents and admin call this driver, never the
machine directly. It must not decide delivery policy: that is the machine's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from meshd.delivery.outcomes import Outcomes
from meshd.qos1.machine import (
    Acked,
    Action,
    Attempt,
    Confirm,
    GiveUp,
    NotStored,
    OutboxEntry,
    Qos1,
    SendAcks,
    SendNack,
)
from meshd.util.shutdown import Shutdown
from meshd.wire import protocol as P
from meshd.wire.protocol import FrameError, Kind

if TYPE_CHECKING:
    from meshd.delivery.dead_letters import DeadLetters
    from meshd.delivery.local_agents import AgentLink
    from meshd.mesh.directory import Directory
    from meshd.mesh.peers import PeerTable

__all__ = ["Qos1Driver"]

log = logging.getLogger("meshd.node")

STORAGE_RETRY = 1.0
"""Seconds between commit attempts while the outbox cannot be written (disk full)."""


class Qos1Driver:
    """Runs :class:`Qos1` inside the daemon."""

    def __init__(self, machine: Qos1, *, node_id: str, stats: Counter[str], outcomes: Outcomes,
                 qos1_ttl: float, link: AgentLink, peer_table: PeerTable, directory: Directory,
                 dead_letters: DeadLetters, route: Callable[[str, P.Header, list[bytes]], Any],
                 shutdown: Shutdown) -> None:
        """``route``: how a unit due for (re)delivery goes out, ``Router.route``, through the node
        (the router is built after this driver, which it calls)."""
        self.machine = machine
        self.node_id = node_id
        self.stats = stats
        self.outcomes = outcomes
        self.qos1_ttl = qos1_ttl
        self.shutdown = shutdown
        self._flush_scheduled = False
        self._retry: asyncio.TimerHandle | None = None
        self._after_flush: list[Callable[[], Any]] = []
        self.link = link
        self.peer_table = peer_table
        self.directory = directory
        self.dead_letters = dead_letters
        self.route = route

    @property
    def stopping(self) -> bool:
        return self.shutdown.begun

    # ------------------------------------------------------------------ read-only

    @property
    def pending(self) -> int:
        return self.machine.pending

    @property
    def in_flight(self) -> int:
        return self.machine.in_flight

    def pending_by_dest(self) -> dict[str, int]:
        return self.machine.pending_by_dest()

    def info(self) -> dict[str, Any]:
        m = self.machine
        return {"pending": m.pending, "in_flight": m.in_flight, **m.stats, "commits": m.store.commits,
                "quarantined": m.store.quarantined}

    # ------------------------------------------------------------------ events in

    def accept(self, rid: bytes | None, sender: str, unit_id: str, dest: str, frames: list[bytes],
               header: P.Header | None = None) -> None:
        self.machine.accept(rid, sender, unit_id, dest, frames, header)
        self._maybe_flush()

    def refusal(self, unit_id: str, dest: str, frames: list[bytes]) -> str | None:
        """Why the outbox cannot take this new unit (OUTBOX_FULL), or None."""
        return self.machine.refusal(unit_id, dest, frames)

    def is_ours(self, unit_id: str | None) -> bool:
        return unit_id is not None and self.machine.is_ours(unit_id)

    def bounced(self, unit_id: str, code: str) -> bool:
        return self.machine.bounced(unit_id, code)

    def reack_if_done(self, unit_id: str, origin: str) -> bool:
        done = self.machine.reack_if_done(unit_id, origin)
        self._maybe_flush()
        return done

    def admit(self, unit_id: str, origin: str, rid: bytes, rid_alive: Callable[[bytes], bool]) -> bool:
        admitted = self.machine.admit(unit_id, origin, rid, rid_alive)
        self._maybe_flush()
        return admitted

    def not_delivered(self, unit_id: str) -> None:
        self.machine.not_delivered(unit_id)

    def agent_acked(self, ids: list[str]) -> None:
        self.machine.agent_acked(ids)
        self._maybe_flush()

    def acks_arrived(self, ids: list[str]) -> None:
        self.perform(self.machine.acks_arrived(ids))
        self._maybe_flush()

    def agent_nacked(self, unit_id: str, error: dict[str, Any]) -> None:
        """A local agent's handler refused a qos-1 unit it was handed (``nack`` from the agent)."""
        self.perform(self.machine.agent_nacked(unit_id, error))
        self._maybe_flush()

    def nacked(self, ids: list[str], error: dict[str, Any]) -> None:
        """The receiving side refused units of ours (a peer's ``nack``, or our own agent's)."""
        for unit_id in ids:
            self.perform(self.machine.nacked(unit_id, error))
        self._maybe_flush()

    def peer_restarted(self, node_id: str) -> None:
        n = self.machine.reack_origin(node_id, time.monotonic() - self.qos1_ttl)
        if n:
            log.info("re-acked %d qos-1 unit(s) handled for restarted peer %s", n, node_id)
        self._maybe_flush()

    def tick(self) -> None:
        self.perform(self.machine.tick())
        self._maybe_flush()

    def housekeeping(self, ack_timeout: float) -> None:
        """Every minute: forget deliveries never acked, prune old done-marks."""
        self.machine.forget_delivering(older_than=max(600.0, 4 * ack_timeout))
        self.machine.store.prune_seen()

    # ------------------------------------------------------------------ commit

    def after_flush(self, action: Callable[[], Any]) -> None:
        """Run ``action`` once what is staged now is on disk (a qos-1 publish's confirmation)."""
        self._after_flush.append(action)
        self.schedule_flush()

    def _maybe_flush(self) -> None:
        if self.machine.needs_flush:
            self.schedule_flush()

    def schedule_flush(self) -> None:
        if not self._flush_scheduled and not self.stopping:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        was = self.machine.storage_error
        actions = self.machine.flush()
        now = self.machine.storage_error
        if now is not None:
            self.stats["qos1_commit_failed"] += 1
            if was is None:  # one line per state change, not one per commit
                log.error("qos-1 storage failed: %s (%s): new qos-1 messages are refused with "
                          "STORAGE_FULL until a commit succeeds; stored ones keep being sent",
                          now, self.machine.store.path)
        elif was is not None:
            log.warning("qos-1 storage recovered (%s)", self.machine.store.path)
        self.perform(actions)
        after, self._after_flush = self._after_flush, []
        for action in after:
            action()
        if now is not None:
            if self.machine.needs_flush and self._retry is None and not self.stopping:
                # What waits (acks, updates of stored units) is written once space returns, not
                # only when some unrelated send comes along.
                self._retry = asyncio.get_running_loop().call_later(STORAGE_RETRY, self._retry_flush)
        elif self.machine.store.dirty:
            self.schedule_flush()

    def _retry_flush(self) -> None:
        self._retry = None
        self.schedule_flush()

    # ------------------------------------------------------------------ actions out

    def perform(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Attempt):
                self._attempt(action.entry)
            elif isinstance(action, Confirm):
                self.link.send(action.rid, {P.KIND: Kind.OK, P.CORR: action.unit_id, P.QOS: 1})
            elif isinstance(action, SendAcks):
                self._send_acks(action.origin, action.ids)
            elif isinstance(action, Acked):
                self._acked(action.entry)
            elif isinstance(action, SendNack):
                self._send_nack(action)
            elif isinstance(action, GiveUp):
                self._give_up(action.entry, action.why, action.reason, action.error)
            elif isinstance(action, NotStored):
                self._not_stored(action)

    def _attempt(self, entry: OutboxEntry) -> None:
        if entry.header is None:  # stored by an older daemon and no longer decodable
            self.machine.remove(entry.id)
            return
        self.route(entry.dest, entry.header, entry.frames)

    def _send_acks(self, origin: str, ids: list[str]) -> None:
        if origin == self.node_id:
            self.acks_arrived(ids)
            return
        peer = self.peer_table.get(origin)
        if peer is not None:
            for chunk in P.chunk_ids(ids):  # each header within the peer's cap, or it is refused
                self.peer_table.send(peer, {P.KIND: Kind.ACK, P.FROM: self.node_id, P.IDS: chunk})

    def _send_nack(self, action: SendNack) -> None:
        if action.origin == self.node_id:
            self.nacked([action.unit_id], action.error)
            return
        peer = self.peer_table.get(action.origin)
        if peer is not None:
            self.peer_table.send(peer, {P.KIND: Kind.NACK, P.FROM: self.node_id, P.IDS: [action.unit_id],
                                        P.ERROR: action.error})

    def _acked(self, entry: OutboxEntry) -> None:
        self.stats["qos1_delivered"] += 1
        topic = entry.header.topic if entry.header is not None else None
        self.outcomes.delivered(entry.id, entry.sender, entry.dest, topic, entry.created_m)

    def _not_stored(self, action: NotStored) -> None:
        entry, message = action.entry, f"qos-1 message not stored: {action.why}; it will not be sent"
        if action.rid is None:  # a durable copy of a publication: nobody waits for it, keep it
            self.dead_letters.record(P.ErrorCode.STORAGE_FULL, f"to {entry.dest!r}: {message}", entry.frames,
                                    entry.header)
            return
        ids: list[Any] = [entry.id]
        if entry.header is not None and entry.header.kind == Kind.BATCH:
            with contextlib.suppress(FrameError):  # name each message, not the batch
                ids = [h.get(P.ID) for h, _ in P.split_batch(entry.frames)]
        for msg_id in ids:
            self.link.send_error(action.rid, msg_id, P.ErrorCode.STORAGE_FULL, message,
                                 retry_after=STORAGE_RETRY)

    def _give_up(self, entry: OutboxEntry, why: str, reason: str = P.ErrorCode.UNDELIVERABLE,
                 nack: dict[str, Any] | None = None) -> None:
        header = entry.header
        self.dead_letters.record(reason, f"to {entry.dest!r}: {why}", entry.frames,
                                header, attempts=entry.attempts)
        sender = self.directory.local.get(entry.sender)
        if sender is None:
            return
        err = P.error_header(sender.name, entry.id, P.ErrorCode.UNDELIVERABLE if nack is None else
                             P.ErrorCode.NACK, f"qos-1 message to {entry.dest!r}: {why}",
                             sender=f"meshd@{self.node_id}")
        if nack is not None:
            fallback = nack.get("fallback")
            if isinstance(fallback, str) and P.valid_topic(fallback):
                err[P.ERROR]["fallback"] = fallback
        if header is not None and header.kind == Kind.BATCH:
            with contextlib.suppress(FrameError):  # name each message, not the batch
                err[P.IDS] = [h.get(P.ID) for h, _ in P.split_batch(entry.frames)]
        self.link.send(sender.rid, err)
