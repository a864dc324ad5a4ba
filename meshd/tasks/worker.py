"""The worker side of tasks: answer ``meshd.task`` requests once per task, with a handled-window.

Owns what an agent needs to take tasks: a handler per capability, and the idempotence that makes a
re-asked task (the owning daemon restarted and asks the same assignee with the same attempt) run
once: a task still running is joined, a task already done is answered from a bounded window of
results. It must not schedule or store anything; it uses only the public Agent API.

::

    async with Agent("summarizer-1", capabilities=["summarize"]) as me:
        worker = TaskWorker(me, {"summarize": summarize})   # async def summarize(task: TaskCall)
"""

from __future__ import annotations

import asyncio
import inspect
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from meshd.errors import ValidationFailed
from meshd.tasks.scheduler import TASK_TOPIC

__all__ = ["TaskCall", "TaskWorker"]


@dataclass(frozen=True)
class TaskCall:
    """One task as a worker's handler sees it."""

    task_id: str
    attempt: int
    title: str
    capability: str
    input: Any
    #: Results of the task's dependencies, by the dependency's id in the plan.
    deps: dict[str, Any] = field(default_factory=dict)
    plan_id: str | None = None
    key: str | None = None
    round: int | None = None
    creator: str = ""
    message: Any = None  # the meshd Message it came in


TaskHandler = Callable[[TaskCall], Awaitable[Any] | Any]


class TaskWorker:
    """Serves tasks on ``agent``: ``handlers`` maps a capability to its handler (or one handler
    takes every capability). ``window`` results are kept to answer re-asked tasks.

    ``runs`` counts handler starts, ``done`` handlers that returned, ``replayed`` re-asks answered
    without running (joined to a running handler, or from the window).
    """

    def __init__(self, agent: Any, handlers: dict[str, TaskHandler] | TaskHandler, *,
                 window: int = 4096) -> None:
        if window < 1:
            raise ValidationFailed("window must be at least 1")
        self.agent = agent
        self.handlers = handlers
        self.window = window
        self.runs = 0
        self.done = 0
        self.replayed = 0
        self._done: OrderedDict[str, tuple[bool, Any, int]] = OrderedDict()
        self._running: dict[str, asyncio.Future[Any]] = {}
        agent.on(TASK_TOPIC)(self._on_task)

    def _handler(self, capability: str) -> TaskHandler:
        if callable(self.handlers):
            return self.handlers
        handler = self.handlers.get(capability)
        if handler is None:
            raise ValidationFailed(f"agent {self.agent.name!r} has no handler for capability {capability!r}")
        return handler

    def _summary(self) -> None:
        self.agent.set_telemetry(tasks_summary={"running": len(self._running), "done": self.done})

    async def _on_task(self, msg: Any) -> Any:
        body = msg.payload if isinstance(msg.payload, dict) else {}
        task_id = str(body.get("task_id", ""))
        attempt = int(body.get("attempt") or 0)
        if not task_id:
            raise ValidationFailed("task request without task_id")
        done = self._done.get(task_id)
        if done is not None:
            ok, value, done_attempt = done
            if ok or done_attempt == attempt:  # a success is final; a failure only for its attempt
                self.replayed += 1
                if ok:
                    return value
                raise value
        running = self._running.get(task_id)
        if running is None:
            call = TaskCall(task_id=task_id, attempt=attempt, title=str(body.get("title", "")),
                            capability=str(body.get("capability", "")), input=body.get("input"),
                            deps=dict(body.get("deps") or {}), plan_id=body.get("plan_id"),
                            key=body.get("key"), round=body.get("round"),
                            creator=str(body.get("creator", "")), message=msg)
            running = asyncio.ensure_future(self._run(call))
            self._running[task_id] = running
            self._summary()
        else:
            self.replayed += 1
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            if msg.cancelled.is_set() and not running.done():
                running.cancel()  # the owner cancelled the task: stop the work too
            raise

    async def _run(self, call: TaskCall) -> Any:
        self.runs += 1
        try:
            result = self._handler(call.capability)(call)
            if inspect.isawaitable(result):
                result = await result
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._remember(call.task_id, False, exc, call.attempt)
            raise
        else:
            self.done += 1
            self._remember(call.task_id, True, result, call.attempt)
            return result
        finally:
            self._running.pop(call.task_id, None)
            self._summary()

    def _remember(self, task_id: str, ok: bool, value: Any, attempt: int) -> None:
        self._done[task_id] = (ok, value, attempt)
        self._done.move_to_end(task_id)
        while len(self._done) > self.window:
            self._done.popitem(last=False)
