"""The task store: tasks and plans of one daemon, in SQLite (``<state_dir>/tasks.db``).

Owns the durable records and their bound. WAL, ``synchronous=FULL`` by default (the same rule as
the qos-1 outbox in meshd/qos1.py: a state change that anyone may act on is on disk first).
Changes are staged and committed in one transaction per loop turn (group commit): ``commit()``
awaits the shared flush, so many tasks changing at once pay one fsync.

It must not schedule, dispatch or talk to agents: the service and the scheduler do that. Records
are plain dicts (the shape ``task_status`` returns); the store keeps all of them in memory too,
which the bound (``tasks.max_stored_tasks``) keeps small.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Any

import msgpack

from meshd.errors import NoSuchTask, TaskStoreFull
from meshd.util.statefiles import make_private_file

__all__ = ["FINISHED", "STATES", "TaskStore"]

log = logging.getLogger("meshd.tasks.store")

#: Every task state, in the order a task usually goes through them.
STATES = ("pending", "ready", "running", "done", "failed", "cancelled")
#: States a task never leaves.
FINISHED = frozenset({"done", "failed", "cancelled"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    state TEXT NOT NULL,
    plan_id TEXT,
    record BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS plans (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    record BLOB NOT NULL
);
"""


def _pack(record: dict[str, Any]) -> bytes:
    return msgpack.packb(record, use_bin_type=True)  # type: ignore[no-any-return]


def _unpack(blob: bytes) -> dict[str, Any]:
    value = msgpack.unpackb(blob, raw=False, strict_map_key=False)
    if not isinstance(value, dict):
        raise ValueError("stored record is not a map")
    return value


class TaskStore:
    """Tasks and plans, durable, bounded; every read is from memory."""

    def __init__(self, path: Path, *, max_tasks: int, fsync: bool = True) -> None:
        self.path = path
        self.max_tasks = max_tasks
        if str(path) != ":memory:":
            make_private_file(Path(path))  # 0600, and so -wal and -shm: it holds task inputs and results
        self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
        self.db.executescript(_SCHEMA)
        self.tasks: dict[str, dict[str, Any]] = {}
        self.plans: dict[str, dict[str, Any]] = {}
        self._seq = 0
        self._dirty_tasks: set[str] = set()
        self._dirty_plans: set[str] = set()
        self._deleted_tasks: set[str] = set()
        self._deleted_plans: set[str] = set()
        self._flush_waiters: asyncio.Future[None] | None = None
        self.commits = 0
        self._load()

    def _load(self) -> None:
        bad = 0
        for seq, blob in self.db.execute("SELECT seq, record FROM tasks ORDER BY seq"):
            try:
                record = _unpack(blob)
            except (ValueError, TypeError, msgpack.ExtraData):
                bad += 1
                continue
            self.tasks[str(record["id"])] = record
            self._seq = max(self._seq, int(seq))
        for seq, blob in self.db.execute("SELECT seq, record FROM plans ORDER BY seq"):
            try:
                record = _unpack(blob)
            except (ValueError, TypeError, msgpack.ExtraData):
                bad += 1
                continue
            self.plans[str(record["id"])] = record
            self._seq = max(self._seq, int(seq))
        if bad:
            log.error("task store %s: %d record(s) did not decode and were skipped", self.path, bad)

    # ------------------------------------------------------------------ reads

    def task(self, task_id: str) -> dict[str, Any]:
        record = self.tasks.get(task_id)
        if record is None:
            raise NoSuchTask(f"no task {task_id!r} on this daemon")
        return record

    def plan(self, plan_id: str) -> dict[str, Any]:
        record = self.plans.get(plan_id)
        if record is None:
            raise NoSuchTask(f"no plan {plan_id!r} on this daemon")
        return record

    def unfinished(self) -> list[dict[str, Any]]:
        return [t for t in self.tasks.values() if t["state"] not in FINISHED]

    # ------------------------------------------------------------------ writes (staged)

    def reserve(self, n: int) -> None:
        """Make room for ``n`` new tasks, pruning finished ones oldest first; TaskStoreFull if not."""
        free = self.max_tasks - len(self.tasks)
        if free >= n:
            return
        if n > self.max_tasks:
            raise TaskStoreFull(
                f"{n} tasks do not fit in a store of tasks.max_stored_tasks = {self.max_tasks}")
        need = n - free
        finished = [t for t in self.tasks.values() if t["state"] in FINISHED]
        finished.sort(key=lambda t: t.get("_seq", 0))
        if len(finished) < need:
            raise TaskStoreFull(
                f"the task store holds {len(self.tasks)} tasks of which only {len(finished)} are finished; "
                f"{n} more do not fit (tasks.max_stored_tasks = {self.max_tasks})")
        for record in finished[:need]:
            self._delete_task(str(record["id"]))
        for plan_id, plan in list(self.plans.items()):
            if not any(tid in self.tasks for tid in plan.get("tasks", [])) and plan.get("state") != "running":
                del self.plans[plan_id]
                self._dirty_plans.discard(plan_id)
                self._deleted_plans.add(plan_id)

    def _delete_task(self, task_id: str) -> None:
        self.tasks.pop(task_id, None)
        self._dirty_tasks.discard(task_id)
        self._deleted_tasks.add(task_id)

    def add_task(self, record: dict[str, Any]) -> None:
        self._seq += 1
        record["_seq"] = self._seq
        self.tasks[str(record["id"])] = record
        self._dirty_tasks.add(str(record["id"]))

    def add_plan(self, record: dict[str, Any]) -> None:
        self._seq += 1
        record["_seq"] = self._seq
        self.plans[str(record["id"])] = record
        self._dirty_plans.add(str(record["id"]))

    def touch_task(self, record: dict[str, Any]) -> None:
        """The record changed: write it with the next commit."""
        self._dirty_tasks.add(str(record["id"]))

    def touch_plan(self, record: dict[str, Any]) -> None:
        self._dirty_plans.add(str(record["id"]))

    # ------------------------------------------------------------------ commit

    @property
    def dirty(self) -> bool:
        return bool(self._dirty_tasks or self._dirty_plans or self._deleted_tasks or self._deleted_plans)

    def flush(self) -> None:
        """Commit everything staged, in one transaction (fsync'd when ``fsync``)."""
        if not self.dirty:
            return
        tasks = [self.tasks[i] for i in self._dirty_tasks if i in self.tasks]
        plans = [self.plans[i] for i in self._dirty_plans if i in self.plans]
        self.db.execute("BEGIN")
        try:
            if tasks:
                self.db.executemany(
                    "INSERT OR REPLACE INTO tasks (id, seq, state, plan_id, record) VALUES (?, ?, ?, ?, ?)",
                    [(t["id"], t["_seq"], t["state"], t.get("plan_id"), _pack(t)) for t in tasks])
            if plans:
                self.db.executemany("INSERT OR REPLACE INTO plans (id, seq, record) VALUES (?, ?, ?)",
                                    [(p["id"], p["_seq"], _pack(p)) for p in plans])
            if self._deleted_tasks:
                self.db.executemany("DELETE FROM tasks WHERE id = ?", [(i,) for i in self._deleted_tasks])
            if self._deleted_plans:
                self.db.executemany("DELETE FROM plans WHERE id = ?", [(i,) for i in self._deleted_plans])
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.commits += 1
        self._dirty_tasks.clear()
        self._dirty_plans.clear()
        self._deleted_tasks.clear()
        self._deleted_plans.clear()

    async def commit(self) -> None:
        """Wait until everything staged so far is on disk; callers in one loop turn share a flush."""
        if not self.dirty:
            return
        waiter = self._flush_waiters
        if waiter is None:
            loop = asyncio.get_running_loop()
            waiter = self._flush_waiters = loop.create_future()
            loop.call_soon(self._flush_now)
        await asyncio.shield(waiter)

    def _flush_now(self) -> None:
        waiter, self._flush_waiters = self._flush_waiters, None
        try:
            self.flush()
        except BaseException as exc:
            if waiter is not None and not waiter.done():
                waiter.set_exception(exc)
            log.exception("task store commit failed")
            return
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.db.close()
