"""qos 1 bookkeeping: the sender's durable outbox and the receiver's seen-set, in one SQLite file.

A qos-1 *unit* is one ZeroMQ message as the client sent it: a single message or a batch. The
sending daemon stages it in the outbox, and only after ``flush`` (one transaction, WAL with
``synchronous=FULL``: fsynced) does it confirm to the client and forward it. The receiving
daemon records a unit's id as *done* once the agent's handler has finished, flushes, and only
then acks to the sender, which deletes the unit. Staged writes from one loop iteration share
one commit (group commit), so the fsync cost is paid per batch of units, not per message.

Everything here is synchronous and cheap except ``flush``; the node calls it once per loop
iteration when something is staged.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

log = logging.getLogger("meshd.delivery")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id TEXT PRIMARY KEY,
    dest TEXT NOT NULL,
    frames BLOB NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    expires REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS seen (
    id TEXT PRIMARY KEY,
    at REAL NOT NULL,
    origin TEXT NOT NULL DEFAULT ''
);
"""


@dataclass(eq=False)
class OutboxEntry:
    """A qos-1 unit waiting for its ack."""

    id: str
    dest: str
    frames: list[bytes]  # [signature, header, payload...] exactly as the client sent it
    created: float
    expires: float
    attempts: int = 0
    next_attempt: float = 0.0  # monotonic; in memory only (after a restart everything is due)
    backoff: float = 0.0
    sender: str = ""
    durable: bool = False
    deferrals: int = 0
    extra: dict[str, object] = field(default_factory=dict)


class DeliveryStore:
    """The outbox and the seen-set of one node (``<state_dir>/delivery.db``)."""

    def __init__(self, path: Path, seen_ttl: float = 24 * 3600.0) -> None:
        self.path = path
        self.seen_ttl = seen_ttl
        self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")  # "accepted" means on disk (RELIABILITY.md)
        self.db.executescript(_SCHEMA)
        self.outbox: dict[str, OutboxEntry] = {}
        self.seen: dict[str, float] = {}
        self.seen_origin: dict[str, str] = {}
        self._add: list[OutboxEntry] = []
        self._update: dict[str, OutboxEntry] = {}
        self._delete: list[str] = []
        self._seen_add: list[tuple[str, float, str]] = []
        self.commits = 0
        self._load()

    def _load(self) -> None:
        now = time.time()
        self.db.execute("DELETE FROM seen WHERE at < ?", (now - self.seen_ttl,))
        for row in self.db.execute("SELECT id, dest, frames, attempts, created, expires FROM outbox"):
            frames = msgpack.unpackb(row[2], raw=False)
            sender = ""
            try:  # the sending agent, to tell it if the unit finally fails
                header = msgpack.unpackb(frames[1], raw=False)
                sender = str(header.get("from", "")) if isinstance(header, dict) else ""
            except (ValueError, TypeError, IndexError, msgpack.ExtraData):
                pass
            entry = OutboxEntry(id=row[0], dest=row[1], frames=list(frames), attempts=int(row[3]),
                                created=float(row[4]), expires=float(row[5]), durable=True, sender=sender)
            self.outbox[entry.id] = entry
        for msg_id, at, origin in self.db.execute("SELECT id, at, origin FROM seen"):
            self.seen[msg_id] = at
            self.seen_origin[msg_id] = origin
        if self.outbox:
            log.info("resuming %d qos-1 message(s) from the outbox", len(self.outbox))

    # ------------------------------------------------------------------ sender side

    def stage(self, entry: OutboxEntry) -> None:
        """Add a unit; it is durable (and may be confirmed and forwarded) after ``flush``."""
        self.outbox[entry.id] = entry
        self._add.append(entry)

    def record_attempt(self, entry: OutboxEntry) -> None:
        """Persist the attempt counter, so a restart does not grant fresh attempts."""
        if entry.durable:
            self._update[entry.id] = entry

    def remove(self, msg_id: str) -> OutboxEntry | None:
        """An ack (or a dead letter) ends a unit's life."""
        entry = self.outbox.pop(msg_id, None)
        if entry is not None:
            self._update.pop(msg_id, None)
            self._delete.append(msg_id)
        return entry

    # ------------------------------------------------------------------ receiver side

    def is_done(self, msg_id: str) -> bool:
        return msg_id in self.seen

    def mark_done(self, msg_id: str, origin: str = "") -> None:
        if msg_id not in self.seen:
            at = time.time()
            self.seen[msg_id] = at
            self.seen_origin[msg_id] = origin
            self._seen_add.append((msg_id, at, origin))

    def done_for(self, origin: str, since: float, limit: int = 10_000) -> list[str]:
        """Units from ``origin`` handled since ``since`` (newest last), to re-ack after its crash."""
        ids = [k for k, at in self.seen.items() if at >= since and self.seen_origin.get(k) == origin]
        return ids[-limit:]

    # ------------------------------------------------------------------ commit

    @property
    def dirty(self) -> bool:
        return bool(self._add or self._update or self._delete or self._seen_add)

    def flush(self) -> list[OutboxEntry]:
        """Commit everything staged in one transaction; return the units that became durable."""
        if not self.dirty:
            return []
        added = [e for e in self._add if e.id in self.outbox]
        self.db.execute("BEGIN")
        try:
            if added:
                self.db.executemany(
                    "INSERT OR REPLACE INTO outbox (id, dest, frames, attempts, created, expires) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    [(e.id, e.dest, msgpack.packb(e.frames, use_bin_type=True), e.attempts, e.created,
                      e.expires) for e in added],
                )
            if self._update:
                self.db.executemany("UPDATE outbox SET attempts = ? WHERE id = ?",
                                    [(e.attempts, e.id) for e in self._update.values()])
            if self._delete:
                self.db.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in self._delete])
            if self._seen_add:
                self.db.executemany("INSERT OR IGNORE INTO seen (id, at, origin) VALUES (?, ?, ?)",
                                    self._seen_add)
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.commits += 1
        self._add, self._update, self._delete, self._seen_add = [], {}, [], []
        for e in added:
            e.durable = True
        return added

    def prune_seen(self) -> int:
        """Forget done-marks older than ``seen_ttl`` (far beyond any retry of them)."""
        cutoff = time.time() - self.seen_ttl
        old = [k for k, at in self.seen.items() if at < cutoff]
        for k in old:
            del self.seen[k]
            self.seen_origin.pop(k, None)
        if old:
            self.db.execute("DELETE FROM seen WHERE at < ?", (cutoff,))
        return len(old)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.db.close()


class DeadLetters:
    """Bounded FIFO of undeliverable messages (oldest evicted), kept whole so they can be replayed.

    Bounded twice: by count (``dead_letter_capacity``) and by bytes, so a burst of large
    payloads cannot grow the daemon without limit.
    """

    def __init__(self, capacity: int = 1024, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._items: dict[int, dict[str, Any]] = {}
        self._bytes = 0
        self.total = 0
        self.evicted = 0

    def add(self, reason: str, detail: str, frames: list[bytes] | None = None,
            header: dict[str, Any] | None = None, attempts: int = 0) -> dict[str, Any]:
        self.total += 1
        kept = list(frames or [])
        letter = {
            "seq": self.total,
            "at": time.time(),
            "reason": reason,
            "detail": detail[:500],
            "attempts": attempts,
            "header": header,
            "frames": kept,
        }
        self._items[self.total] = letter
        self._bytes += sum(len(f) for f in kept)
        while self._items and (len(self._items) > self.capacity or self._bytes > self.max_bytes):
            oldest = next(iter(self._items))
            self._bytes -= sum(len(f) for f in self._items.pop(oldest)["frames"])
            self.evicted += 1
        return letter

    def list(self) -> list[dict[str, Any]]:
        return list(self._items.values())

    def get(self, seq: int) -> dict[str, Any] | None:
        return self._items.get(seq)

    def pop(self, seq: int) -> dict[str, Any] | None:
        letter = self._items.pop(seq, None)
        if letter is not None:
            self._bytes -= sum(len(f) for f in letter["frames"])
        return letter

    def purge(self) -> int:
        n = len(self._items)
        self._items.clear()
        self._bytes = 0
        return n


@dataclass(eq=False)
class _Delivering:
    origin: str  # node id the unit came from (our own for local senders)
    rid: bytes  # the agent connection it was handed to
    at: float


class Qos1:
    """The at-least-once state machine, with the node's routing injected as callbacks.

    Sender side: ``accept`` stages a unit; after the group commit it is confirmed to the client
    and tried; an ack removes it; a bounce (receiver absent, inbox full, peer unreachable) defers
    it without using an attempt; unacknowledged attempts back off (ack timeout doubling) until
    ``attempts`` are used or ``ttl`` passes, then ``give_up`` makes it a dead letter.
    Receiver side: ``admit`` decides whether a unit is handed to its agent (never twice while
    the agent still has it; never again once done); ``agent_acked`` records done-marks, which are
    flushed before the ack travels back to the sender.
    """

    def __init__(
        self,
        store: DeliveryStore,
        *,
        attempts: int,
        ack_timeout: float,
        ttl: float,
        attempt: Callable[[OutboxEntry], None],
        confirm: Callable[[bytes, str], None],
        send_acks: Callable[[str, list[str]], None],
        acked: Callable[[OutboxEntry], None],
        give_up: Callable[[OutboxEntry, str], None],
        schedule_flush: Callable[[], None],
    ) -> None:
        self.store = store
        self.max_attempts = attempts
        self.ack_timeout = ack_timeout
        self.ttl = ttl
        self._attempt = attempt
        self._confirm = confirm
        self._send_acks = send_acks
        self._acked = acked
        self._give_up = give_up
        self._schedule_flush = schedule_flush
        self._confirm_to: dict[str, bytes] = {}
        self._delivering: dict[str, _Delivering] = {}
        self._acks_out: dict[str, list[str]] = {}
        self.stats: Counter[str] = Counter()

    # ------------------------------------------------------------------ sender side

    def accept(self, rid: bytes | None, sender: str, unit_id: str, dest: str, frames: list[bytes]) -> None:
        """Stage a unit; ``rid`` (if any) is told "ok" once it is on disk."""
        now = time.time()
        if unit_id in self.store.outbox:
            if rid is not None:
                self._confirm_to[unit_id] = rid  # a client retry of a unit we have: confirm again
            self._schedule_flush()
            return
        entry = OutboxEntry(id=unit_id, dest=dest, frames=frames, created=now, expires=now + self.ttl,
                            sender=sender)
        self.store.stage(entry)
        if rid is not None:
            self._confirm_to[unit_id] = rid
        self.stats["accepted"] += 1
        self._schedule_flush()

    def try_entry(self, entry: OutboxEntry) -> None:
        entry.attempts += 1
        entry.next_attempt = time.monotonic() + self.ack_timeout * 2 ** (entry.attempts - 1)
        self.store.record_attempt(entry)
        self.stats["attempts"] += 1
        self._attempt(entry)

    def bounced(self, unit_id: str, code: str) -> bool:
        """A delivery attempt bounced; True if it was one of our units (it now waits)."""
        entry = self.store.outbox.get(unit_id)
        if entry is None:
            return False
        entry.attempts = max(0, entry.attempts - 1)  # a bounce is not a delivery: refund it
        entry.deferrals += 1
        entry.next_attempt = time.monotonic() + min(0.1 * 2 ** min(entry.deferrals, 6), 5.0)
        entry.extra["last_error"] = code
        self.stats[f"deferred_{code.lower()}"] += 1
        return True

    def acks_arrived(self, ids: list[str]) -> None:
        for unit_id in ids:
            entry = self.store.remove(unit_id)
            if entry is not None:
                self.stats["acked"] += 1
                self._acked(entry)
        self._schedule_flush()

    def tick(self) -> None:
        """Retry what is due; give up on what is out of attempts or time."""
        now_m = time.monotonic()
        now = time.time()
        for entry in list(self.store.outbox.values()):
            if not entry.durable or entry.next_attempt > now_m:
                continue
            if now > entry.expires:
                self._drop(entry, f"not delivered within qos1_ttl ({self.ttl:g} s); last error: "
                                  f"{entry.extra.get('last_error', 'none')}")
            elif entry.attempts >= self.max_attempts:
                self._drop(entry, f"no ack after {entry.attempts} attempt(s)")
            else:
                self.try_entry(entry)

    def _drop(self, entry: OutboxEntry, why: str) -> None:
        self.store.remove(entry.id)
        self.stats["dead_lettered"] += 1
        self._give_up(entry, why)
        self._schedule_flush()

    # ------------------------------------------------------------------ receiver side

    def admit(self, unit_id: str, origin: str, rid: bytes, rid_alive: Callable[[bytes], bool]) -> bool:
        """Should this unit be handed to the agent? Duplicates are dropped (done ones re-acked)."""
        if self.store.is_done(unit_id):
            self.stats["dup_suppressed"] += 1
            self._acks_out.setdefault(origin, []).append(unit_id)
            self._schedule_flush()
            return False
        current = self._delivering.get(unit_id)
        if current is not None and current.rid == rid and rid_alive(rid):
            self.stats["dup_in_flight"] += 1
            return False
        self._delivering[unit_id] = _Delivering(origin, rid, time.monotonic())
        return True

    def reack_if_done(self, unit_id: str, origin: str) -> bool:
        """A unit we already handled came back (its sender lost our ack): ack it again."""
        if not self.store.is_done(unit_id):
            return False
        self.stats["dup_suppressed"] += 1
        self._acks_out.setdefault(origin, []).append(unit_id)
        self._schedule_flush()
        return True

    def reack_origin(self, origin: str, since: float) -> int:
        """A sending daemon restarted: ack again what we handled for it, in case our acks died
        with it (otherwise its resumed outbox would retry units that are already done)."""
        ids = self.store.done_for(origin, since)
        if ids:
            self._acks_out.setdefault(origin, []).extend(ids)
            self._schedule_flush()
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
        self._schedule_flush()

    def forget_delivering(self, older_than: float) -> None:
        """Drop in-flight records of agents that never acked (a retry will redeliver)."""
        cutoff = time.monotonic() - older_than
        for unit_id in [k for k, d in self._delivering.items() if d.at < cutoff]:
            del self._delivering[unit_id]

    # ------------------------------------------------------------------ commit

    def flush(self) -> None:
        """Group commit, then what waited for it: confirmations, first tries, acks to senders."""
        durable = self.store.flush()
        for entry in durable:
            rid = self._confirm_to.pop(entry.id, None)
            if rid is not None:
                self._confirm(rid, entry.id)
            self.try_entry(entry)
        for unit_id, rid in list(self._confirm_to.items()):
            if unit_id in self.store.outbox and self.store.outbox[unit_id].durable:
                del self._confirm_to[unit_id]
                self._confirm(rid, unit_id)
        acks, self._acks_out = self._acks_out, {}
        for origin, ids in acks.items():
            self._send_acks(origin, ids)
        if self.store.dirty:
            self._schedule_flush()

    @property
    def pending(self) -> int:
        return len(self.store.outbox)

    @property
    def in_flight(self) -> int:
        return len(self._delivering)
