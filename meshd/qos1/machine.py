"""qos 1: the durable outbox and seen-set (SQLite), and the at-least-once machine, sans I/O.

A qos-1 *unit* is one ZeroMQ message as the client sent it: a single message or a batch. The
sending daemon stages it in the outbox, and only after ``flush`` (one transaction, WAL with
``synchronous=FULL``: fsynced) does it confirm to the client and forward it. The receiving
daemon records a unit's id as *done* once the agent's handler has finished, flushes, and only
then acks to the sender, which deletes the unit. Staged writes from one loop iteration share
one commit (group commit), so the fsync cost is paid per batch of units, not per message.

Owns: :class:`Qos1`, the state machine, over a :class:`DeliveryStore` (the SQLite file
``<state_dir>/delivery.db``, meshd/qos1/store.py; re-exported here). Like h11, the machine
takes events (accept, ack, bounce, tick, flush, ...) and *returns actions* (:class:`Confirm`,
:class:`Attempt`, :class:`SendAcks`, :class:`Acked`, :class:`GiveUp`) instead of calling back;
its clocks are injected. It must not touch sockets, routing or plugins: ``meshd/qos1_driver.py``
performs the actions. Unit tests drive it with a fake clock and an in-memory SQLite store.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meshd.qos1.bounds import OutboxBounds, unit_size
from meshd.qos1.store import DELIVERY_DB_FIX, DeliveryStore, OutboxEntry, StoreWriteFailed
from meshd.util.backoff import backoff_delay
from meshd.util.priority import priority_of
from meshd.wire import protocol as P
from meshd.wire.protocol import FrameError

__all__ = [
    "DELIVERY_DB_FIX",
    "Acked",
    "Action",
    "Attempt",
    "Confirm",
    "DeliveryStore",
    "GiveUp",
    "NotStored",
    "OutboxBounds",
    "OutboxEntry",
    "Qos1",
    "SendAcks",
    "SendNack",
    "StoreWriteFailed",
    "unit_size",
]

log = logging.getLogger("meshd.delivery")

# ---------------------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class Confirm:
    """Tell the client connection ``rid`` that unit ``unit_id`` is on disk (``ok`` with qos 1)."""

    rid: bytes
    unit_id: str


@dataclass(frozen=True, slots=True)
class Attempt:
    """Route the unit now (an attempt was counted)."""

    entry: OutboxEntry


@dataclass(frozen=True, slots=True)
class SendAcks:
    """Ack these handled unit ids to the daemon ``origin`` (perhaps this one)."""

    origin: str
    ids: list[str]


@dataclass(frozen=True, slots=True)
class SendNack:
    """Tell the daemon ``origin`` (perhaps this one) that the agent refused unit ``unit_id``:
    ``error`` is its NACK map (``retry``, ``retry_after``, ``fallback``)."""

    origin: str
    unit_id: str
    error: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Acked:
    """The receiver acknowledged the unit: its handler finished."""

    entry: OutboxEntry


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Out of attempts or time: the unit becomes a dead letter; tell its sender why."""

    entry: OutboxEntry
    why: str
    #: The dead letter's reason: UNDELIVERABLE, or ``nack`` (its handler refused it for good).
    reason: str = P.ErrorCode.UNDELIVERABLE
    #: The code the sender is told: UNDELIVERABLE, or NACK (with the handler's ``error`` map).
    error: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class NotStored:
    """The commit failed: this new unit was not stored and will not be sent. Tell ``rid`` (its
    client, if any) at once, with ``why``."""

    entry: OutboxEntry
    rid: bytes | None
    why: str


Action = Confirm | Attempt | SendAcks | SendNack | Acked | GiveUp | NotStored

NACK_MAX_DELAY = 3600.0
"""The longest ``retry_after`` a NACK may ask for (seconds); longer ones are cut to it."""


@dataclass(eq=False)
class _Delivering:
    origin: str  # node id the unit came from (our own for local senders)
    rid: bytes  # the agent connection it was handed to
    at: float



def _priority(entry: OutboxEntry) -> int:
    fields = entry.header.fields if entry.header is not None else {}
    return priority_of(fields.get(P.PRIO))


class Qos1:
    """The at-least-once state machine: events in, actions out.

    Sender side: ``accept`` stages a unit; ``flush`` commits and returns its confirmation and
    first attempt; ``acks_arrived`` returns what was acknowledged; a bounce (receiver absent,
    inbox full, peer unreachable) defers a unit without using an attempt; ``tick`` returns
    retries (ack timeout doubling, jittered) and, once ``attempts`` are used or ``ttl`` passed,
    ``GiveUp``. Receiver side: ``admit`` decides whether a unit is handed to its agent (never
    twice while the agent still has it; never again once done); ``agent_acked`` records
    done-marks, and the next ``flush`` returns the acks to send back. ``needs_flush`` says when a
    commit is due.
    """

    def __init__(self, store: DeliveryStore, *, attempts: int, ack_timeout: float, ttl: float,
                 monotonic: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 jitter: float = 0.0, bounds: OutboxBounds | None = None) -> None:
        self.store = store
        self.bounds = bounds or OutboxBounds()
        self.max_attempts = attempts
        self.ack_timeout = ack_timeout
        self.ttl = ttl
        self._monotonic = monotonic
        self._wall = wall
        self._jitter = jitter
        self._confirm_to: dict[str, bytes] = {}
        self._delivering: dict[str, _Delivering] = {}
        self._acks_out: dict[str, list[str]] = {}
        self.stats: Counter[str] = Counter()
        #: Why the last commit failed (disk full...), or None once a commit succeeds again.
        self.storage_error: str | None = None

    @property
    def needs_flush(self) -> bool:
        """Something staged, confirmations or acks waiting: call ``flush`` soon."""
        return self.store.dirty or bool(self._acks_out) or bool(self._confirm_to)

    # ------------------------------------------------------------------ sender side

    def refusal(self, unit_id: str, dest: str, frames: list[bytes]) -> str | None:
        """Why a new unit for ``dest`` would pass an outbox bound (None: it fits).

        A unit already in the outbox (a client's retry) always fits: it is confirmed again."""
        store, b = self.store, self.bounds
        if unit_id in store.outbox:
            return None
        size = unit_size(frames)
        if store.dest_units[dest] + 1 > b.per_dest_units:
            why = f"{store.dest_units[dest]} unit(s) wait for {dest!r} (qos1_outbox_per_dest_max)"
        elif store.dest_bytes[dest] + size > b.per_dest_bytes:
            why = f"{store.dest_bytes[dest]} bytes wait for {dest!r} (qos1_outbox_per_dest_max_bytes)"
        elif len(store.outbox) + 1 > b.total_units:
            why = f"{len(store.outbox)} unit(s) wait in the outbox (qos1_outbox_max)"
        elif store.total_bytes + size > b.total_bytes:
            why = f"{store.total_bytes} bytes wait in the outbox (qos1_outbox_max_bytes)"
        else:
            return None
        self.stats["refused_outbox_full"] += 1
        return f"qos-1 outbox full: {why}; retry later"

    def accept(self, rid: bytes | None, sender: str, unit_id: str, dest: str, frames: list[bytes],
               header: P.Header | None = None) -> None:
        """Stage a unit; ``rid`` (if any) is confirmed by the ``flush`` that makes it durable."""
        now = self._wall()
        now_m = self._monotonic()
        if unit_id in self.store.outbox:
            if rid is not None:
                self._confirm_to[unit_id] = rid  # a client retry of a unit we have: confirm again
            return
        if header is None:
            with contextlib.suppress(FrameError, IndexError):
                header = P.decode_header(frames[1])
        entry = OutboxEntry(id=unit_id, dest=dest, frames=frames, created=now, expires=now + self.ttl,
                            sender=sender, header=header, expires_m=now_m + self.ttl, created_m=now_m)
        self.store.stage(entry)
        if rid is not None:
            self._confirm_to[unit_id] = rid
        self.stats["accepted"] += 1

    def _try(self, entry: OutboxEntry) -> Attempt:
        entry.attempts += 1
        entry.next_attempt = self._monotonic() + backoff_delay(
            entry.attempts, self.ack_timeout, float("inf"), jitter=self._jitter)
        self.store.record_attempt(entry)
        self.stats["attempts"] += 1
        return Attempt(entry)

    def bounced(self, unit_id: str, code: str) -> bool:
        """A delivery attempt bounced; True if it was one of our units (it now waits)."""
        entry = self.store.outbox.get(unit_id)
        if entry is None:
            return False
        entry.attempts = max(0, entry.attempts - 1)  # a bounce is not a delivery: refund it
        entry.deferrals += 1
        entry.next_attempt = self._monotonic() + backoff_delay(entry.deferrals + 1, 0.1, 5.0,
                                                               jitter=self._jitter)
        entry.extra["last_error"] = code
        self.stats[f"deferred_{code.lower()}"] += 1
        return True

    def is_ours(self, unit_id: str) -> bool:
        """Is ``unit_id`` a unit in our outbox (an error about it is a bounce of ours)?"""
        return unit_id in self.store.outbox

    def acks_arrived(self, ids: list[str]) -> list[Action]:
        actions: list[Action] = []
        for unit_id in ids:
            entry = self.store.remove(unit_id)
            if entry is not None:
                self.stats["acked"] += 1
                actions.append(Acked(entry))
        return actions

    def nacked(self, unit_id: str, error: dict[str, Any]) -> list[Action]:
        """The receiving agent refused our unit (NACK). ``retry`` true: the next attempt waits
        ``retry_after`` seconds (within ``qos1_attempts`` and ``qos1_ttl``, which ``tick``
        enforces); false: the unit is a dead letter ``nack`` at once."""
        entry = self.store.outbox.get(unit_id)
        if entry is None:
            return []
        self.stats["nacked"] += 1
        after = error.get("retry_after")
        if error.get("retry") is True:
            delay = float(after) if isinstance(after, (int, float)) and not isinstance(after, bool) \
                and after >= 0 else self.ack_timeout
            entry.next_attempt = self._monotonic() + min(delay, NACK_MAX_DELAY)
            entry.extra["last_error"] = P.ErrorCode.NACK
            self.stats["nack_retries"] += 1
            return []
        self.store.remove(entry.id)
        self.stats["dead_lettered"] += 1
        why = f"refused by its handler (NACK): {P.safe_repr(error.get('message'), 200)}"
        return [GiveUp(entry, why, "nack", error)]

    def tick(self) -> list[Action]:
        """Retry what is due, lower priority numbers first (then in outbox order); give up on what
        is out of attempts or time."""
        now_m = self._monotonic()  # never the wall clock: a clock jump expires nothing
        actions: list[Action] = []
        due = [entry for entry in self.store.outbox.values()
               if entry.durable and entry.next_attempt <= now_m]
        if len(due) > 1:
            due.sort(key=_priority)  # stable: FIFO within one priority
        for entry in due:
            if now_m > entry.expires_m:
                actions.append(self._drop(entry, f"not delivered within qos1_ttl ({self.ttl:g} s); "
                                                 f"last error: {entry.extra.get('last_error', 'none')}"))
            elif entry.attempts >= self.max_attempts:
                actions.append(self._drop(entry, f"no ack after {entry.attempts} attempt(s)"))
            else:
                actions.append(self._try(entry))
        return actions

    def _drop(self, entry: OutboxEntry, why: str) -> GiveUp:
        self.store.remove(entry.id)
        self.stats["dead_lettered"] += 1
        return GiveUp(entry, why)

    def remove(self, unit_id: str) -> None:
        """Forget a unit that cannot travel (its stored header no longer decodes)."""
        self.store.remove(unit_id)

    # ------------------------------------------------------------------ receiver side

    def admit(self, unit_id: str, origin: str, rid: bytes, rid_alive: Callable[[bytes], bool]) -> bool:
        """Should this unit be handed to the agent? Duplicates are dropped (done ones re-acked)."""
        if self.store.is_done(unit_id):
            self.stats["dup_suppressed"] += 1
            self._acks_out.setdefault(origin, []).append(unit_id)
            return False
        current = self._delivering.get(unit_id)
        if current is not None and current.rid == rid and rid_alive(rid):
            self.stats["dup_in_flight"] += 1
            return False
        self._delivering[unit_id] = _Delivering(origin, rid, self._monotonic())
        return True

    def reack_if_done(self, unit_id: str, origin: str) -> bool:
        """A unit we already handled came back (its sender lost our ack): ack it again."""
        if not self.store.is_done(unit_id):
            return False
        self.stats["dup_suppressed"] += 1
        self._acks_out.setdefault(origin, []).append(unit_id)
        return True

    def reack_origin(self, origin: str, since: float) -> int:
        """A sending daemon restarted: ack again what we handled for it since ``since`` (this
        host's monotonic clock), in case our acks died with it (otherwise its resumed outbox
        would retry units that are already done)."""
        ids = self.store.done_for(origin, since)
        if ids:
            self._acks_out.setdefault(origin, []).extend(ids)
        return len(ids)

    def not_delivered(self, unit_id: str) -> None:
        """The hand-over to the agent failed (inbox full, gone): a retry may try again."""
        self._delivering.pop(unit_id, None)

    def agent_acked(self, ids: list[str]) -> None:
        for unit_id in ids:
            d = self._delivering.pop(unit_id, None)
            if d is None:
                continue
            self.store.mark_done(unit_id, d.origin)
            self._acks_out.setdefault(d.origin, []).append(unit_id)

    def agent_nacked(self, unit_id: str, error: dict[str, Any]) -> list[Action]:
        """The agent's handler refused the unit it was handed (NACK): no done-mark when it may be
        retried (the next attempt is handed over again), one when not (a late copy is dropped);
        either way the sending daemon is told, which decides (``nacked``)."""
        d = self._delivering.pop(unit_id, None)
        if d is None:
            return []
        if error.get("retry") is not True:
            self.store.mark_done(unit_id, d.origin)
        return [SendNack(d.origin, unit_id, error)]

    def forget_delivering(self, older_than: float) -> None:
        """Drop in-flight records of agents that never acked (a retry will redeliver)."""
        cutoff = self._monotonic() - older_than
        for unit_id in [k for k, d in self._delivering.items() if d.at < cutoff]:
            del self._delivering[unit_id]

    # ------------------------------------------------------------------ commit

    def flush(self) -> list[Action]:
        """Group commit, then what waited for it: confirmations, first tries, acks to senders.

        A failed commit (disk full, I/O error) returns ``NotStored`` for each new unit (none is
        confirmed or sent) and sets ``storage_error``; updates, deletes and done-marks of units
        already stored wait for the next commit; acks of handled units go out all the same."""
        actions: list[Action] = []
        try:
            durable = self.store.flush()
        except StoreWriteFailed as exc:
            self.storage_error = str(exc)
            self.stats["not_stored"] += len(exc.lost)
            actions.extend(NotStored(e, self._confirm_to.pop(e.id, None), str(exc)) for e in exc.lost)
            # The handlers did finish: ack from memory (the done-marks are kept in memory and
            # written once the disk takes them), so the sender's verdict matches what happened.
            # The price: a crash of this daemon before they are written can repeat a handler
            # for a unit retried after the crash (DELIVERY.md).
            acks, self._acks_out = self._acks_out, {}
            actions.extend(SendAcks(origin, ids) for origin, ids in acks.items())
            self.stats["acked_unwritten"] += sum(len(ids) for ids in acks.values())
            return actions
        self.storage_error = None
        for entry in durable:
            rid = self._confirm_to.pop(entry.id, None)
            if rid is not None:
                actions.append(Confirm(rid, entry.id))
            actions.append(self._try(entry))
        for unit_id, rid in list(self._confirm_to.items()):
            if unit_id in self.store.outbox and self.store.outbox[unit_id].durable:
                del self._confirm_to[unit_id]
                actions.append(Confirm(rid, unit_id))
        acks, self._acks_out = self._acks_out, {}
        actions.extend(SendAcks(origin, ids) for origin, ids in acks.items())
        return actions

    @property
    def pending(self) -> int:
        return len(self.store.outbox)

    @property
    def in_flight(self) -> int:
        return len(self._delivering)

    def pending_by_dest(self) -> dict[str, int]:
        """Outbox units by destination agent (a copy)."""
        return dict(self.store.dest_units)
