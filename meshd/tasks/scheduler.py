"""The scheduler: runs one task to its end on the least-loaded online agent with its capability.

Owns picking (from the agent directory's heartbeat telemetry plus the dispatches this daemon has
in flight), dispatching (a request on topic :data:`TASK_TOPIC` with a deadline), retrying on
another agent, waiting (bounded by the task's deadline) while no capable agent is online, and
re-asking a task's assignee with the same attempt after a restart. Every assignment is on disk
before the request leaves, and every result before anyone hears of it (see docs/tasks.md,
"Exactly once").

It must not create tasks, decide plan dependencies or answer callers: :mod:`meshd.tasks.service`
does, through the :class:`TaskHost` it passes in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Protocol

from meshd.errors import MeshError
from meshd.tasks.store import FINISHED, TaskStore
from meshd.util.logonce import LogOnce

if TYPE_CHECKING:  # meshd.config imports pydantic: not in the daemon's image (meshd/daemon/reexec.py)
    from meshd.config.settings import TaskSettings

__all__ = ["TASK_TOPIC", "Directory", "Scheduler", "TaskHost", "agent_load"]

log = logging.getLogger("meshd.tasks.scheduler")

#: The topic a task is dispatched on (a request; :class:`meshd.tasks.TaskWorker` answers it).
TASK_TOPIC = "meshd.task"

_RUNNING_WORDS = frozenset({"running", "in_progress", "in-progress", "active", "working", "busy"})


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _active_tasks(summary: Any) -> float:
    """In-progress tasks from a ``tasks_summary``: a number, a map of counts, or a list of items."""
    if isinstance(summary, (int, float)) and not isinstance(summary, bool):
        return float(summary)
    if isinstance(summary, dict):
        return sum(_number(v) for k, v in summary.items() if str(k).lower() in _RUNNING_WORDS)
    if isinstance(summary, list):
        return float(sum(1 for item in summary
                         if isinstance(item, dict) and str(item.get("status", "")).lower() in _RUNNING_WORDS))
    return 0.0


def agent_load(record: dict[str, Any], in_flight: int = 0) -> tuple[float, float, str]:
    """Sort key of a candidate agent, least loaded first.

    Load is the largest of its reported ``queue_depth``, its reported in-progress tasks
    (``tasks_summary``) and the dispatches this daemon has in flight to it (telemetry is up to a
    heartbeat old; our own count is current). Ties go to the lower ``context_used_pct``, then
    the name.
    """
    tele = record.get("telemetry") or {}
    if not isinstance(tele, dict):
        tele = {}
    load = max(_number(tele.get("queue_depth")), _active_tasks(tele.get("tasks_summary")), float(in_flight))
    return (load, _number(tele.get("context_used_pct")), str(record.get("name", "")))


def _consume(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned request's outcome, so asyncio does not report it as never retrieved."""
    if not task.cancelled():
        task.exception()


class Directory:
    """The agent directory as the daemon reports it, fetched at most once per ``refresh`` seconds."""

    def __init__(self, agent: Any, refresh: float) -> None:
        self.agent = agent
        self.refresh = refresh
        self._agents: dict[str, dict[str, Any]] = {}
        self._at = -1e9
        self._fetching: asyncio.Future[dict[str, dict[str, Any]]] | None = None
        self._quiet = LogOnce(log, capacity=4)

    async def snapshot(self, max_age: float | None = None) -> dict[str, dict[str, Any]]:
        """Agent name -> directory record, no older than ``max_age`` (default ``refresh``)."""
        age = self.refresh if max_age is None else max_age
        if time.monotonic() - self._at <= age:
            return self._agents
        if self._fetching is None:
            self._fetching = asyncio.ensure_future(self._fetch())
        fetching = self._fetching
        try:
            return await asyncio.shield(fetching)
        finally:
            if fetching.done() and self._fetching is fetching:
                self._fetching = None

    def cached(self, name: str) -> dict[str, Any]:
        """The last record seen of agent ``name`` ({} if none), without asking the daemon."""
        return self._agents.get(name, {})

    async def _fetch(self) -> dict[str, dict[str, Any]]:
        try:
            listed = await self.agent.agents()
        except MeshError as exc:
            # The daemon did not answer (restarting, busy): keep what we knew and ask again soon;
            # a waiting task keeps waiting instead of losing its driver.
            self._quiet.log("fetch", "cannot read the agent directory (%s: %s); using the last one seen",
                            exc.code, exc.message)
            self._at = time.monotonic() - self.refresh / 2
            return self._agents
        self._quiet.forget("fetch")
        self._agents = {str(a.get("name")): a for a in listed if isinstance(a, dict)}
        self._at = time.monotonic()
        return self._agents


class TaskHost(Protocol):
    """What the scheduler needs from the service that owns it."""

    def task_store(self) -> TaskStore: ...

    def event(self, name: str, record: dict[str, Any], **extra: Any) -> None: ...

    def finished(self, record: dict[str, Any]) -> None: ...

    def task_payload(self, record: dict[str, Any]) -> dict[str, Any]: ...

    def time_left(self, record: dict[str, Any]) -> float: ...


class Scheduler:
    """Drives tasks: ``drive(record)`` returns when the task is done, failed or cancelled."""

    def __init__(self, agent: Any, settings: TaskSettings, host: TaskHost) -> None:
        self.agent = agent
        self.settings = settings
        self.host = host
        self.directory = Directory(agent, settings.directory_refresh)
        self.in_flight: Counter[str] = Counter()
        #: Set by the service's stop(): dispatches in flight are abandoned, not cancelled.
        self.stopping = False

    # ------------------------------------------------------------------ picking

    def candidates(self, agents: dict[str, dict[str, Any]], capability: str) -> list[dict[str, Any]]:
        own = getattr(self.agent, "name", None)
        return [a for name, a in agents.items()
                if name != own and a.get("state") == "online" and capability in (a.get("capabilities") or [])]

    async def pick(self, record: dict[str, Any], tried: set[str]) -> str | None:
        """The least-loaded online agent with the capability (untried ones first), counted as in
        flight; waits while there is none, and returns None when the task's deadline passes."""
        capability = str(record["capability"])
        said_why = False
        while True:
            agents = await self.directory.snapshot()
            found = self.candidates(agents, capability)
            fresh = [a for a in found if a.get("name") not in tried]
            pool = fresh or found
            if pool:
                best = min(pool, key=lambda a: agent_load(a, self.in_flight[str(a.get("name"))]))
                name = str(best["name"])
                self.in_flight[name] += 1
                return name
            if not said_why:
                record["why"] = f"no online agent with capability {capability!r}"
                self.host.task_store().touch_task(record)
                self.host.event("waiting", record)
                said_why = True
            left = self.host.time_left(record)
            if left <= 0:
                return None
            await asyncio.sleep(min(self.settings.directory_refresh, left))

    async def _wait_online(self, name: str, within: float) -> bool:
        end = time.monotonic() + within
        while True:
            agents = await self.directory.snapshot()
            if agents.get(name, {}).get("state") == "online":
                return True
            if time.monotonic() >= end:
                return False
            await asyncio.sleep(min(self.settings.directory_refresh, max(0.0, end - time.monotonic())))

    # ------------------------------------------------------------------ dispatch

    async def _dispatch(self, record: dict[str, Any], assignee: str) -> tuple[bool, Any]:
        """One attempt: a request with a deadline, abandoned early if the assignee leaves."""
        left = self.host.time_left(record)
        timeout = max(0.001, min(self.settings.dispatch_timeout, left))
        payload = self.host.task_payload(record)
        trace = record.get("_trace")  # the creating call's trace context (TaskService.create_task)
        headers = trace if isinstance(trace, dict) else None
        request = asyncio.ensure_future(self.agent.request(assignee, TASK_TOPIC, payload, timeout=timeout,
                                                           headers=headers))
        watch = asyncio.ensure_future(self._watch(assignee))
        try:
            await asyncio.wait({request, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not request.done():
                if self.stopping:
                    # The service is stopping, not the task: let the assignee finish (no cancel
                    # sent). After the restart it is re-asked with this attempt and answers from
                    # its window instead of running the task again.
                    request.add_done_callback(_consume)
                else:
                    request.cancel()
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, MeshError):
                await watch
        if not request.done() or request.cancelled():
            with contextlib.suppress(asyncio.CancelledError, MeshError):
                await request
            return False, f"assignee {assignee!r} left the mesh directory while running the task"
        exc = request.exception()
        if exc is None:
            return True, request.result()
        if isinstance(exc, MeshError):
            return False, f"{exc.code} from {assignee!r}: {exc.message}"
        return False, f"{type(exc).__name__} from {assignee!r}: {exc}"

    async def _watch(self, assignee: str) -> None:
        """Returns when ``assignee`` is gone from the directory or offline."""
        while True:
            await asyncio.sleep(self.settings.directory_refresh)
            agents = await self.directory.snapshot()
            state = agents.get(assignee, {}).get("state")
            if state is None or state == "offline":
                return

    # ------------------------------------------------------------------ the task's life

    async def drive(self, record: dict[str, Any]) -> None:
        """Run ``record`` (state ready, or running after a restart) until it is finished."""
        store = self.host.task_store()
        tried: set[str] = set(record.get("tried") or [])
        resume = record["state"] == "running"
        while record["state"] not in FINISHED:
            if self.host.time_left(record) <= 0:
                why = record.get("why")
                await self._fail(record, f"deadline passed: {why}" if why else "deadline passed")
                return
            if resume:
                resume = False
                assignee = str(record["assignee"])
                back = await self._wait_online(
                    assignee, min(self.settings.resume_grace, self.host.time_left(record)))
                if not back:
                    ok, outcome = False, (f"assignee {assignee!r} not online within "
                                          f"{self.settings.resume_grace:g} s after a restart")
                else:
                    self.in_flight[assignee] += 1
                    try:
                        ok, outcome = await self._dispatch(record, assignee)
                    finally:
                        self.in_flight[assignee] -= 1
            else:
                picked = await self.pick(record, tried)
                if picked is None:
                    await self._fail(record, f"deadline passed: {record.get('why') or 'not dispatched'}")
                    return
                assignee = picked
                try:
                    record.update(state="running", assignee=assignee, attempts=int(record["attempts"]) + 1,
                                  why=None)
                    store.touch_task(record)
                    await store.commit()  # the assignment is on disk before the request leaves
                    self.host.event("assigned", record)
                    ok, outcome = await self._dispatch(record, assignee)
                finally:
                    self.in_flight[assignee] -= 1
            if record["state"] in FINISHED:  # cancelled meanwhile
                return
            if ok:
                record.update(state="done", result=outcome, error=None, why=None)
                store.touch_task(record)
                await store.commit()  # done is on disk before anyone hears of it
                self.host.event("done", record)
                self.host.finished(record)
                return
            tried.add(assignee)
            record["tried"] = sorted(tried)
            record["error"] = str(outcome)
            if int(record["attempts"]) >= self.settings.max_attempts:
                await self._fail(record, f"{outcome} (after {record['attempts']} attempt(s))")
                return
            record["state"] = "ready"
            store.touch_task(record)
            await store.commit()
            log.info("task %s: attempt %s failed (%s); retrying", record["id"], record["attempts"], outcome)
            self.host.event("retry", record)

    async def _fail(self, record: dict[str, Any], why: str) -> None:
        record.update(state="failed", error=why)
        self.host.task_store().touch_task(record)
        await self.host.task_store().commit()
        self.host.event("failed", record, dead_letter=True)
        self.host.finished(record)
