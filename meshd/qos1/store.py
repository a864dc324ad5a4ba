"""The durable outbox and seen-set of qos 1: the SQLite file ``<state_dir>/delivery.db``.

Owns: :class:`DeliveryStore` (schema, load with quarantine of bad rows, staged writes committed
in one fsynced transaction per flush: group commit) and :class:`OutboxEntry` (one staged unit).
It must not touch sockets, routing, or the at-least-once rules: those are :class:`meshd.qos1.Qos1`'s,
which drives this store (unit tests give it an in-memory one).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from meshd.errors import StateFileError
from meshd.qos1.bounds import unit_size
from meshd.util.statefiles import make_private_file
from meshd.wire import protocol as P
from meshd.wire.protocol import FrameError

__all__ = ["DELIVERY_DB_FIX", "DeliveryStore", "OutboxEntry", "StoreWriteFailed"]

log = logging.getLogger("meshd.delivery")

DELIVERY_DB_FIX = ("stop meshd, move the file (and its -wal and -shm files) aside, and start again: "
                   "the qos-1 messages still in it are then not sent; or restore it from a backup")

WRITABLE_FIX = ("make the state directory writable by meshd's user: a file system remounted "
                "read-only after disk errors needs checking (dmesg) and a read-write remount; "
                "or set state_dir to a writable place")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id TEXT PRIMARY KEY,
    dest TEXT NOT NULL,
    frames BLOB NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    expires REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS quarantine (
    id TEXT PRIMARY KEY,
    dest TEXT,
    frames BLOB,
    attempts INTEGER,
    created REAL,
    expires REAL,
    reason TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS seen (
    id TEXT PRIMARY KEY,
    at REAL NOT NULL,
    origin TEXT NOT NULL DEFAULT ''
);
"""


@dataclass(eq=False)
class OutboxEntry:
    """A qos-1 unit waiting for its ack.

    It carries its decoded ``header`` (destination, sender, kind and topic come from it), so no
    attempt, outcome or dead letter decodes the header frame again.
    """

    id: str
    dest: str
    frames: list[bytes]  # [signature, header, payload...] exactly as the client sent it
    created: float  # wall clock of this node, persisted and shown (dead letters); never compared
    expires: float  # wall clock, persisted: after a restart the TTL left is read from it (clamped)
    header: P.Header | None = None  # None only for a stored unit whose header no longer decodes
    attempts: int = 0
    next_attempt: float = 0.0  # monotonic; in memory only (after a restart everything is due)
    expires_m: float = 0.0  # monotonic: when qos1_ttl runs out (what ``tick`` compares)
    created_m: float = 0.0  # monotonic: when it was accepted (delivery latency)
    backoff: float = 0.0
    sender: str = ""
    durable: bool = False
    deferrals: int = 0
    extra: dict[str, object] = field(default_factory=dict)


class StoreWriteFailed(Exception):
    """A commit failed (disk full, I/O error): ``lost`` are the new units that were not stored."""

    def __init__(self, lost: list[OutboxEntry], cause: sqlite3.Error) -> None:
        super().__init__(str(cause))
        self.lost = lost
        self.cause = cause


class DeliveryStore:
    """The outbox and the seen-set of one node (``<state_dir>/delivery.db``).

    It keeps the outbox's size per destination and in total (units and bytes, see
    :func:`unit_size`) so the machine can refuse a unit that would pass a bound.
    """

    def __init__(self, path: Path | str, seen_ttl: float = 24 * 3600.0, *,
                 wall: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        """``path`` may be ``":memory:"`` (tests). Done-marks are aged on ``monotonic`` while the
        daemon runs (a wall-clock jump prunes nothing); ``wall`` dates them on disk, the only
        clock that survives a restart, and is read once at load, clamped to ``seen_ttl``."""
        self.path = path
        self.seen_ttl = seen_ttl
        self._wall = wall
        self._monotonic = monotonic
        self.quarantined = 0
        try:
            if str(path) != ":memory:":
                make_private_file(Path(path))  # 0600, and so -wal and -shm: it holds agents' messages
        except OSError as exc:
            fix = WRITABLE_FIX if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) else DELIVERY_DB_FIX
            raise StateFileError(path, f"cannot be opened ({exc.strerror or exc})", fix) from None
        try:
            self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")  # "accepted" means on disk (RELIABILITY.md)
            self.db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise StateFileError(path, f"not a usable SQLite database ({exc})", DELIVERY_DB_FIX) from None
        self.outbox: dict[str, OutboxEntry] = {}
        self.dest_units: Counter[str] = Counter()
        self.dest_bytes: Counter[str] = Counter()
        self.total_bytes = 0
        self.seen: dict[str, float] = {}
        self.seen_origin: dict[str, str] = {}
        self._add: list[OutboxEntry] = []
        self._update: dict[str, OutboxEntry] = {}
        self._delete: list[str] = []
        self._seen_add: list[tuple[str, float, str]] = []
        self.commits = 0
        try:
            self._load()
        except sqlite3.DatabaseError as exc:
            self.db.close()
            raise StateFileError(path, f"cannot be read ({exc})", DELIVERY_DB_FIX) from None

    def _load(self) -> None:
        now = self._wall()
        now_m = self._monotonic()
        self.db.execute("DELETE FROM seen WHERE at < ?", (now - self.seen_ttl,))
        bad: list[tuple[tuple[Any, ...], str]] = []
        for row in self.db.execute("SELECT id, dest, frames, attempts, created, expires FROM outbox"):
            entry = self._entry_from_row(row, now, now_m)
            if isinstance(entry, str):
                bad.append((row, entry))
                continue
            self._count(entry, 1)
            self.outbox[entry.id] = entry
        if bad:
            self._quarantine(bad, now)
        for msg_id, at, origin in self.db.execute("SELECT id, at, origin FROM seen"):
            self.seen[msg_id] = now_m - min(max(now - at, 0.0), self.seen_ttl)
            self.seen_origin[msg_id] = origin
        if self.outbox:
            log.info("resuming %d qos-1 message(s) from the outbox", len(self.outbox))

    @staticmethod
    def _entry_from_row(row: tuple[Any, ...], now: float, now_m: float) -> OutboxEntry | str:
        """A stored unit, or why the row cannot be one (then it is quarantined). ``now`` is the
        wall clock (stored times are wall-clock, read back only here), ``now_m`` the monotonic one."""
        try:
            frames = msgpack.unpackb(row[2], raw=False)
            if not isinstance(frames, list) or len(frames) < 3 or \
                    not all(isinstance(f, bytes) for f in frames):
                return "frames are not a list of at least 3 byte strings"
            header = P.decode_header(frames[1])  # decoded once, here
            created, expires = float(row[4]), float(row[5])
            # The TTL left, by this host's wall clock across the restart, never more than the TTL.
            left = min(max(expires - now, 0.0), max(expires - created, 0.0))
            return OutboxEntry(id=str(row[0]), dest=str(row[1]), frames=list(frames),
                               attempts=int(row[3]), created=created, expires=expires, durable=True,
                               sender=header.sender or "", header=header, expires_m=now_m + left,
                               created_m=now_m - min(max(now - created, 0.0), left))
        except (FrameError, ValueError, TypeError, IndexError, msgpack.ExtraData) as exc:
            return f"{type(exc).__name__}: {exc}"[:200]

    def _quarantine(self, bad: list[tuple[tuple[Any, ...], str]], now: float) -> None:
        """Move unreadable outbox rows aside (table ``quarantine``): kept, reported, never sent."""
        self.db.execute("BEGIN")
        self.db.executemany(
            "INSERT OR REPLACE INTO quarantine (id, dest, frames, attempts, created, expires, reason, at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [(*row, why, now) for row, why in bad])
        self.db.executemany("DELETE FROM outbox WHERE id = ?", [(row[0],) for row, _ in bad])
        self.db.execute("COMMIT")
        self.quarantined = len(bad)
        log.warning("quarantined %d unreadable qos-1 row(s) of %s into its table 'quarantine' (first: "
                    "%s: %s); they are not sent", len(bad), self.path, bad[0][0][0], bad[0][1])

    # ------------------------------------------------------------------ sender side

    def stage(self, entry: OutboxEntry) -> None:
        """Add a unit; it is durable (and may be confirmed and forwarded) after ``flush``."""
        if entry.id not in self.outbox:
            self._count(entry, 1)
        self.outbox[entry.id] = entry
        self._add.append(entry)

    def _count(self, entry: OutboxEntry, sign: int) -> None:
        size = unit_size(entry.frames)
        self.dest_units[entry.dest] += sign
        self.dest_bytes[entry.dest] += sign * size
        self.total_bytes += sign * size
        if self.dest_units[entry.dest] <= 0:
            del self.dest_units[entry.dest]
            self.dest_bytes.pop(entry.dest, None)

    def record_attempt(self, entry: OutboxEntry) -> None:
        """Persist the attempt counter, so a restart does not grant fresh attempts."""
        if entry.durable:
            self._update[entry.id] = entry

    def remove(self, msg_id: str) -> OutboxEntry | None:
        """An ack (or a dead letter) ends a unit's life."""
        entry = self.outbox.pop(msg_id, None)
        if entry is not None:
            self._count(entry, -1)
            self._update.pop(msg_id, None)
            self._delete.append(msg_id)
        return entry

    # ------------------------------------------------------------------ receiver side

    def is_done(self, msg_id: str) -> bool:
        return msg_id in self.seen

    def mark_done(self, msg_id: str, origin: str = "") -> None:
        if msg_id not in self.seen:
            self.seen[msg_id] = self._monotonic()
            self.seen_origin[msg_id] = origin
            self._seen_add.append((msg_id, self._wall(), origin))

    def done_for(self, origin: str, since: float, limit: int = 10_000) -> list[str]:
        """Units from ``origin`` handled since ``since`` (monotonic; newest last), to re-ack after
        its crash."""
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
        try:
            self.db.execute("BEGIN")
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
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                self.db.execute("ROLLBACK")
            # The new units were not stored: forget them (their senders are told); what was
            # already durable keeps its pending updates, deletes and done-marks for the next try.
            for e in added:
                self.outbox.pop(e.id, None)
                self._count(e, -1)
            self._add = []
            raise StoreWriteFailed(added, exc) from exc
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self.db.execute("ROLLBACK")
            raise
        self.commits += 1
        self._add, self._update, self._delete, self._seen_add = [], {}, [], []
        for e in added:
            e.durable = True
        return added

    def prune_seen(self) -> int:
        """Forget done-marks older than ``seen_ttl`` (far beyond any retry of them)."""
        cutoff = self._monotonic() - self.seen_ttl
        old = [k for k, at in self.seen.items() if at < cutoff]
        for k in old:
            del self.seen[k]
            self.seen_origin.pop(k, None)
        if old:
            self.db.executemany("DELETE FROM seen WHERE id = ?", [(k,) for k in old])
        return len(old)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.db.close()
