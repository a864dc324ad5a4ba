"""TaskService: the tasks and plans one daemon owns, behind the interface the tools call.

Owns the public operations (create_task, create_plan, task_status, plan_status, wait_task,
cancel_task, list_tasks), the task records' life outside a dispatch (creation, readiness when
dependencies finish, failing dependants, plan state, re-plan rounds), resuming after a restart,
and the events it emits. Dispatching and retrying are :mod:`meshd.tasks.scheduler`'s; the DAG
checks are :mod:`meshd.tasks.plans`'; durability is :mod:`meshd.tasks.store`'s.

It must not touch the daemon's internals: it works through a public :class:`meshd.Agent`
attached to the daemon (in the daemon, the system agent), and reports through ``emit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshd.errors import MeshError, ValidationFailed
from meshd.tasks.deadlines import Deadlines
from meshd.tasks.plans import PlanItem, compile_plan, plan_state
from meshd.tasks.scheduler import Scheduler
from meshd.tasks.store import FINISHED, STATES, TaskStore
from meshd.util.backoff import backoff_delay
from meshd.wire.payloads import encode_payload

if TYPE_CHECKING:  # meshd.config imports pydantic: not in the daemon's image (meshd/daemon/reexec.py)
    from meshd.config.settings import Settings

__all__ = ["REPLAN_TOPIC", "TaskService", "public"]

log = logging.getLogger("meshd.tasks")

#: The topic on which a plan's creator is asked for the next round (a request; see docs/tasks.md).
REPLAN_TOPIC = "meshd.plan.round"

_MAX_TITLE = 500
_DISPATCH_OVERHEAD = 4096  # room in a dispatch payload for everything but the input and deps
_MAX_CAPABILITY = 128
_SUMMARY_KEYS = ("id", "title", "capability", "state", "assignee", "attempts", "error", "creator", "plan_id",
                 "key", "round", "why")


def public(record: dict[str, Any]) -> dict[str, Any]:
    """A copy of a stored record without the store's private keys."""
    return {k: v for k, v in record.items() if not k.startswith("_")}


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


class TaskService:
    """Tasks and plans of one daemon; see docs/tasks.md.

    ``agent`` is an attached :class:`meshd.Agent` (the scheduler dispatches and reads the
    directory through it); ``emit(event, data)`` reports ``task.*`` and ``plan.*`` events.
    """

    def __init__(self, agent: Any, store_path: Path, settings: Settings,
                 emit: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.agent = agent
        self.settings = settings
        self.limits = settings.tasks
        self.store_path = store_path
        self._emit = emit
        self.store: TaskStore | None = None
        self.scheduler = Scheduler(agent, settings.tasks, self)
        #: Deadlines on the monotonic clock: a wall-clock jump expires no task.
        self.deadlines = Deadlines(2 * self.limits.max_stored_tasks)
        self._drivers: dict[str, asyncio.Task[None]] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._replanning: set[str] = set()
        self._stopping = False
        self.stats: Counter[str] = Counter()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the store and resume every unfinished task (kill -9 safe; see docs/tasks.md)."""
        self.store = TaskStore(self.store_path, max_tasks=self.limits.max_stored_tasks,
                               fsync=self.limits.fsync)
        for record in self.store.unfinished():
            if record["state"] == "pending" and self._deps_done(record):
                record["state"] = "ready"
                self.store.touch_task(record)
        self.store.flush()
        resumed = 0
        for record in self.store.unfinished():
            if record["state"] in ("ready", "running"):
                self._drive(record)
                resumed += 1
        for plan in list(self.store.plans.values()):
            if plan.get("state") != "running":
                continue
            self.deadlines.left(plan)  # read once, before its tasks: they end with it
            for task_id in plan["tasks"]:  # a failure whose cascade had not reached the disk
                ended = self.store.tasks.get(task_id)
                if ended is not None and ended["state"] in ("failed", "cancelled"):
                    self._fail_dependants(plan, ended)
            self._plan_changed(plan)
        if resumed:
            log.info("resuming %d task(s) from %s", resumed, self.store_path)

    async def stop(self) -> None:
        """Stop driving tasks (they stay stored as they are and resume at the next start)."""
        self._stopping = True
        self.scheduler.stopping = True
        pending = list(self._drivers.values()) + list(self._background)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._drivers.clear()
        if self.store is not None:
            self.store.close()
            self.store = None

    def task_store(self) -> TaskStore:
        """The open store (for the scheduler)."""
        return self._store()

    def _store(self) -> TaskStore:
        if self.store is None:
            raise MeshError("the task service is not started")
        return self.store

    # ------------------------------------------------------------------ the interface

    async def create_task(self, *, creator: str, title: str, input: Any, capability: str,
                          deadline_s: float | None = None, trace: dict[str, str] | None = None
                          ) -> dict[str, Any]:
        """Store a task and start scheduling it; returns its record once it is on disk.
        ``trace``: the creating call's W3C trace headers; its dispatches carry them, so the
        task's work belongs to that call's trace."""
        store = self._store()
        item = PlanItem("task", self._check_title(title), self._check_capability(capability), input)
        deadline = self._deadline(deadline_s)
        self._check_input(input, "input")
        store.reserve(1)
        record = self._new_record(item, creator=creator, deadline=deadline, plan_id=None, deps=[], round_no=0,
                                  trace=trace)
        record["key"] = None
        store.add_task(record)
        # Started before the commit: when the directory is fresh the assignment is staged in this
        # loop turn and shares the creation's fsync; the request still leaves only after it.
        self._drive(record)
        await self._commit_created([record])
        self.event("created", record)
        return public(record)

    async def create_plan(self, *, creator: str, tasks: list[dict[str, Any]], rounds: int = 1,
                          deadline_s: float | None = None, trace: dict[str, str] | None = None
                          ) -> dict[str, Any]:
        """Check the DAG, then store the plan and its tasks and start the ready ones.

        Raises ValidationFailed (a cycle, an unknown dependency, too many tasks, bad fields)
        before anything is created.
        """
        store = self._store()
        if type(rounds) is not int or not 1 <= rounds <= self.limits.max_rounds:
            raise ValidationFailed(f"rounds: 1..{self.limits.max_rounds} (tasks.max_rounds) required")
        items = compile_plan(tasks, max_tasks=self.limits.max_plan_tasks)
        for item in items:
            self._check_capability(item.capability)
            self._check_input(item.input, f"tasks[{item.key}].input")
        deadline = self._deadline(deadline_s)
        store.reserve(len(items))
        plan = {"id": _new_id("p"), "creator": creator, "state": "running", "tasks": [], "rounds": rounds,
                "round": 1, "created_at": time.time(), "deadline": deadline, "error": None}
        if trace:
            plan["_trace"] = trace  # every round's tasks carry the creating call's trace
        records = self._add_round(plan, items, round_no=1)
        store.add_plan(plan)
        self.deadlines.left(plan)  # its tasks (this round's and later rounds') end with it
        ready = [r for r in records if r["state"] == "ready"]
        for record in ready:  # before the commit, as in create_task
            self._drive(record)
        await self._commit_created(records, plan)
        self.event("created", plan, kind="plan")
        for record in records:
            self.event("created", record)
        return self.plan_status(str(plan["id"]))

    def task_status(self, task_id: str) -> dict[str, Any]:
        """The task's record (NoSuchTask if this daemon has none by that id)."""
        return public(self._store().task(str(task_id)))

    def plan_status(self, plan_id: str) -> dict[str, Any]:
        """The plan's record with its tasks' states and results, and counts per state."""
        store = self._store()
        plan = store.plan(str(plan_id))
        tasks = [store.tasks[t] for t in plan["tasks"] if t in store.tasks]
        out = public(plan)
        out["counts"] = {s: n for s, n in Counter(t["state"] for t in tasks).items()}
        keys = ("id", "key", "round", "title", "capability", "state", "assignee", "attempts", "result",
                "error", "deps", "why")
        out["tasks"] = [{k: t.get(k) for k in keys} for t in tasks]
        return out

    async def wait_task(self, task_id: str, timeout_s: float) -> dict[str, Any]:
        """The task's record once it is finished, or as it is when ``timeout_s`` runs out."""
        record = self._store().task(str(task_id))
        if not timeout_s or timeout_s <= 0:
            raise ValidationFailed("timeout_s: a positive number of seconds is required")
        end = time.monotonic() + timeout_s
        while record["state"] not in FINISHED:
            left = end - time.monotonic()
            if left <= 0:
                break
            changed = self._changed.setdefault(record["id"], asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), left)
        return public(record)

    def cancel_task(self, task_id: str, *, by: str) -> dict[str, Any]:
        """Cancel an unfinished task (its running dispatch is cancelled too; dependants fail).

        A finished task is returned unchanged.
        """
        store = self._store()
        record = store.task(str(task_id))
        if record["state"] in FINISHED:
            return public(record)
        record.update(state="cancelled", error=f"cancelled by {by}", why=None)
        store.touch_task(record)
        store.flush()
        driver = self._drivers.pop(record["id"], None)
        if driver is not None:
            driver.cancel()
        self.event("cancelled", record, by=by)
        self.finished(record)
        return public(record)

    def list_tasks(self, *, state: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Tasks, newest first, optionally only those in ``state``."""
        if state is not None and state not in STATES:
            raise ValidationFailed(f"state: one of {', '.join(STATES)} required")
        records = sorted(self._store().tasks.values(), key=lambda t: t.get("_seq", 0), reverse=True)
        if state is not None:
            records = [t for t in records if t["state"] == state]
        return [public(t) for t in records[:max(0, int(limit))]]

    # ------------------------------------------------------------------ TaskHost (for the scheduler)

    def event(self, name: str, record: dict[str, Any], kind: str = "task", **extra: Any) -> None:
        """Report ``<kind>.<name>`` to ``emit``; a failing emit is logged, never raised."""
        self.stats[f"{kind}.{name}"] += 1
        if self._emit is None:
            return
        if kind == "task":
            data = {k: record.get(k) for k in _SUMMARY_KEYS}
        else:
            data = {k: record.get(k) for k in ("id", "creator", "state", "round", "rounds", "error")}
            data["tasks"] = len(record.get("tasks", []))
        data.update(extra)
        data["event"] = f"{kind}.{name}"
        try:
            self._emit(f"{kind}.{name}", data)
        except Exception:
            log.exception("emitting %s.%s failed", kind, name)

    def task_payload(self, record: dict[str, Any]) -> dict[str, Any]:
        """What the assignee's handler receives (see docs/tasks.md, "What a worker receives")."""
        store = self._store()
        deps: dict[str, Any] = {}
        for dep_id in record.get("deps") or []:
            dep = store.tasks.get(dep_id)
            if dep is not None:
                deps[str(dep.get("key") or dep_id)] = dep.get("result")
        return {"task_id": record["id"], "attempt": record["attempts"], "title": record["title"],
                "capability": record["capability"], "input": record["input"], "deps": deps,
                "plan_id": record.get("plan_id"), "key": record.get("key"), "round": record.get("round"),
                "creator": record["creator"]}

    def time_left(self, record: dict[str, Any]) -> float:
        """Seconds left of a task's or plan's deadline, on this host's monotonic clock."""
        return self.deadlines.left(record)

    def finished(self, record: dict[str, Any]) -> None:
        """A task reached done, failed or cancelled: wake waiters, move its plan along."""
        self.deadlines.forget(str(record["id"]))
        changed = self._changed.pop(record["id"], None)
        if changed is not None:
            changed.set()
        if self._drivers.get(record["id"]) is asyncio.current_task():
            self._drivers.pop(record["id"], None)
        plan_id = record.get("plan_id")
        store = self.store
        if not plan_id or store is None or plan_id not in store.plans:
            return
        plan = store.plans[plan_id]
        if record["state"] == "done":
            for dependant in self._dependants(plan, record["id"]):
                if dependant["state"] == "pending" and self._deps_done(dependant):
                    dependant["state"] = "ready"
                    store.touch_task(dependant)
                    self._drive(dependant)
        else:
            self._fail_dependants(plan, record)
        self._plan_changed(plan)

    # ------------------------------------------------------------------ internals

    def _new_record(self, item: PlanItem, *, creator: str, deadline: float, plan_id: str | None,
                    deps: list[str], round_no: int, trace: dict[str, str] | None = None) -> dict[str, Any]:
        record = {"id": _new_id("t"), "key": item.key, "title": item.title, "input": item.input,
                  "capability": item.capability, "state": "ready" if not deps else "pending",
                  "assignee": None, "attempts": 0, "result": None, "error": None, "creator": str(creator),
                  "plan_id": plan_id, "deps": deps, "round": round_no, "created_at": time.time(),
                  "deadline": deadline, "why": None, "tried": []}
        if trace:
            record["_trace"] = dict(trace)  # private (``public`` leaves it out); dispatches carry it
        return record

    def _add_round(self, plan: dict[str, Any], items: list[PlanItem], round_no: int) -> list[dict[str, Any]]:
        store = self._store()
        ids: dict[str, str] = {}
        records = []
        for item in items:  # dependency order: every dep has its id already
            record = self._new_record(item, creator=plan["creator"], deadline=float(plan["deadline"]),
                                      plan_id=plan["id"], deps=[ids[d] for d in item.deps], round_no=round_no,
                                      trace=plan.get("_trace"))
            ids[item.key] = record["id"]
            store.add_task(record)
            records.append(record)
        plan["tasks"] = list(plan["tasks"]) + [r["id"] for r in records]
        return records

    def _drive(self, record: dict[str, Any]) -> None:
        if self._stopping or record["id"] in self._drivers:
            return
        task = asyncio.ensure_future(self._run_driver(record))
        self._drivers[record["id"]] = task

    async def _run_driver(self, record: dict[str, Any]) -> None:
        failures = 0
        try:
            while True:
                try:
                    await self.scheduler.drive(record)
                    return
                except asyncio.CancelledError:
                    raise
                except Exception:  # a bug or a store error: never leave a task without its driver
                    failures += 1
                    log.exception("task %s: the scheduler failed (%d time(s)); trying again", record["id"],
                                  failures)
                    await asyncio.sleep(backoff_delay(failures, 0.5, 30.0))
        finally:
            if self._drivers.get(record["id"]) is asyncio.current_task():
                del self._drivers[record["id"]]

    async def _commit_created(self, records: list[dict[str, Any]],
                              plan: dict[str, Any] | None = None) -> None:
        """Commit new records; if that fails, forget them (and stop their drivers) and raise."""
        store = self._store()
        try:
            await store.commit()
        except BaseException:
            for record in records:
                driver = self._drivers.pop(record["id"], None)
                if driver is not None:
                    driver.cancel()
                store.tasks.pop(record["id"], None)
            if plan is not None:
                store.plans.pop(plan["id"], None)
            raise

    def _deps_done(self, record: dict[str, Any]) -> bool:
        tasks = self._store().tasks
        return all(tasks.get(d, {}).get("state") == "done" for d in record.get("deps") or [])

    def _dependants(self, plan: dict[str, Any], task_id: str) -> list[dict[str, Any]]:
        tasks = self._store().tasks
        return [tasks[t] for t in plan["tasks"] if t in tasks and task_id in (tasks[t].get("deps") or [])]

    def _fail_dependants(self, plan: dict[str, Any], record: dict[str, Any]) -> None:
        store = self._store()
        todo = [record]
        while todo:
            failed = todo.pop()
            for dependant in self._dependants(plan, failed["id"]):
                if dependant["state"] in FINISHED:
                    continue
                dependant.update(state="failed", why=None,
                                 error=f"dependency {failed.get('key') or failed['id']!r} {failed['state']}")
                store.touch_task(dependant)
                driver = self._drivers.pop(dependant["id"], None)
                if driver is not None:
                    driver.cancel()
                self.event("failed", dependant, dead_letter=False)
                changed = self._changed.pop(dependant["id"], None)
                if changed is not None:
                    changed.set()
                todo.append(dependant)
        self._commit_soon()

    def _plan_changed(self, plan: dict[str, Any]) -> None:
        store = self._store()
        states = [store.tasks[t]["state"] for t in plan["tasks"] if t in store.tasks]
        current = [store.tasks[t]["state"] for t in plan["tasks"]
                   if t in store.tasks and store.tasks[t].get("round") == plan["round"]]
        new = plan_state(states)
        if new == "done" and plan_state(current) == "done" and int(plan["round"]) < int(plan["rounds"]):
            self._replan(plan)
            return
        if new != plan["state"]:
            plan["state"] = new
            store.touch_plan(plan)
            self._commit_soon()
            self.event(new, plan, kind="plan")

    def _replan(self, plan: dict[str, Any]) -> None:
        if plan["id"] in self._replanning or self._stopping:
            return
        self._replanning.add(plan["id"])
        task = asyncio.ensure_future(self._next_round(plan))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _next_round(self, plan: dict[str, Any]) -> None:
        """Ask the plan's creator for the next round; an empty answer (or a failure) ends the plan."""
        store = self._store()
        try:
            done = [store.tasks[t] for t in plan["tasks"] if t in store.tasks]
            results = {str(t["key"]): t.get("result") for t in done if t.get("round") == plan["round"]}
            left = self.deadlines.left(plan)
            reply: Any = None
            error = None
            if left > 0:
                try:
                    reply = await self.agent.request(
                        plan["creator"], REPLAN_TOPIC,
                        {"plan_id": plan["id"], "round": plan["round"], "rounds": plan["rounds"],
                         "results": results},
                        timeout=min(self.limits.dispatch_timeout, left))
                except MeshError as exc:
                    error = f"re-plan request to {plan['creator']!r} failed: {exc.code}: {exc.message}"
            tasks = reply.get("tasks") if isinstance(reply, dict) else reply
            if error is None and tasks:
                try:
                    items = compile_plan(tasks, max_tasks=self.limits.max_plan_tasks)
                    store.reserve(len(items))
                except MeshError as exc:
                    error = f"round {int(plan['round']) + 1} refused: {exc.message}"
                else:
                    plan["round"] = int(plan["round"]) + 1
                    records = self._add_round(plan, items, round_no=int(plan["round"]))
                    store.touch_plan(plan)
                    await store.commit()
                    self.event("round", plan, kind="plan")
                    for record in records:
                        self.event("created", record)
                        if record["state"] == "ready":
                            self._drive(record)
                    return
            plan["rounds"] = plan["round"]  # no further round: the plan ends with this one
            plan["error"] = error
            store.touch_plan(plan)
        finally:
            self._replanning.discard(plan["id"])
        self._plan_changed(plan)

    def _commit_soon(self) -> None:
        if self._stopping:
            return
        task = asyncio.ensure_future(self._store().commit())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _check_title(self, title: Any) -> str:
        if not isinstance(title, str) or not title.strip():
            raise ValidationFailed("title: a non-empty string is required")
        return title.strip()[:_MAX_TITLE]

    def _check_capability(self, capability: Any) -> str:
        if not isinstance(capability, str) or not capability.strip() or len(capability) > _MAX_CAPABILITY:
            raise ValidationFailed(f"capability: a non-empty string of at most {_MAX_CAPABILITY} characters "
                                   "is required")
        return capability.strip()

    def _check_input(self, value: Any, where: str) -> None:
        try:
            size = len(encode_payload(value))
        except ValidationFailed as exc:
            raise ValidationFailed(f"{where}: {exc.message}") from None
        limit = self.settings.max_payload_bytes - _DISPATCH_OVERHEAD
        if size > limit:  # it could never be dispatched
            raise ValidationFailed(f"{where}: {size} bytes encoded, more than the {limit} a dispatch can "
                                   "carry (max_payload_bytes less room for the task's other fields)")

    def _deadline(self, deadline_s: float | None) -> float:
        if deadline_s is None:
            return time.time() + self.limits.default_deadline
        if type(deadline_s) not in (int, float) or not deadline_s > 0:
            raise ValidationFailed("deadline_s: a positive number of seconds is required")
        return time.time() + float(deadline_s)
