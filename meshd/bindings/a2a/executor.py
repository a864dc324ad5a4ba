"""An A2A message to an exposed mesh agent becomes one mesh request, its events the task's.

``execute`` sends the request to the agent named by the call's tenant, with the client's time
budget (request or message metadata ``timeout_s``, or the ``X-Meshd-Timeout`` header; else
``a2a.default_timeout``; at most ``a2a.max_timeout``), on the topic the message's metadata names
(else ``a2a.topic``); with ``a2a.through_tools``, through the daemon's ``request_agent`` tool, so
its approval policy applies (a call held for a person is ``TASK_STATE_AUTH_REQUIRED`` until
decided). Each ``progress`` note of the handler becomes a ``TASK_STATE_WORKING``
status update carrying the note, the reply an artifact and ``TASK_STATE_COMPLETED``, a meshd
error the state of :data:`meshd.bindings.a2a.parts.ERROR_STATES`. ``CancelTask`` cancels the
awaiting call, which cancels the mesh request (the handler's task is cancelled). Owns that
sequence; the SDK owns the task records and the streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from a2a.helpers.proto_helpers import new_task_from_user_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import Message, Part, Role, TaskState

from meshd.bindings.a2a.cards import exposed
from meshd.bindings.a2a.parts import error_parts, parts_from_payload, payload_from_parts, state_for_error
from meshd.client import Agent
from meshd.client.tracing import trace_headers
from meshd.errors import Cancelled, MeshError, RequestTimeout, TaskFailed, ValidationFailed

__all__ = ["NOTES_MAX", "TIMEOUT_HEADER", "ExposePolicy", "MeshExecutor", "budget_of"]

log = logging.getLogger("meshd.a2a")

TIMEOUT_HEADER: Final = "x-meshd-timeout"
NOTES_MAX: Final = 256
"""Progress notes of one task waiting to become status updates; past it the oldest is dropped
(counted): a handler that reports faster than the client reads cannot grow this process."""
HELD_PREFIX: Final = "held for approval"
TASK_WAIT_SLICE: Final = 300.0  # the longest wait_task the tools allow by default ([tools] max_wait)


@dataclass(slots=True)
class ExposePolicy:
    """Which mesh agents this server serves, and the budgets and topic of the requests it makes."""

    patterns: list[str]
    topic: str = "a2a.message"
    default_timeout: float = 30.0
    max_timeout: float = 300.0
    through_tools: bool = False  # by the request_agent tool: approvals, quotas, authorization apply
    default_agent: str | None = None  # where a call without a tenant goes
    tasks_agent: str = ""  # the virtual agent whose messages become meshd tasks ("" = none)
    own: set[str] = field(default_factory=set)  # this process's agents: never served (no loops)


def _seconds(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def budget_of(context: RequestContext, policy: ExposePolicy) -> float:
    """The client's time budget for this message, bounded by ``policy.max_timeout``."""
    headers = context.call_context.state.get("headers") or {}
    message_meta = dict(context.message.metadata) if context.message is not None else {}
    for candidate in (context.metadata.get("timeout_s"), message_meta.get("timeout_s"),
                      headers.get(TIMEOUT_HEADER)):
        seconds = _seconds(candidate)
        if seconds is not None:
            return min(seconds, policy.max_timeout)
    return min(policy.default_timeout, policy.max_timeout)


def _agent_message(context: RequestContext, parts: list[Part]) -> Message:
    return Message(role=Role.ROLE_AGENT, message_id=uuid.uuid4().hex,
                   task_id=context.task_id or "", context_id=context.context_id or "", parts=parts)


class MeshExecutor(AgentExecutor):
    """The SDK's ``AgentExecutor`` over a meshd :class:`~meshd.client.Agent`."""

    def __init__(self, agent: Agent, policy: ExposePolicy,
                 on_outcome: Callable[[str], None] | None = None) -> None:
        self.agent = agent
        self.policy = policy
        self.notes_dropped = 0
        self._cancelling: set[asyncio.Future[Any]] = set()  # cancel_task calls of cancelled tasks
        self._on_outcome = on_outcome or (lambda state: None)

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id = context.task_id or "", context.context_id or ""
        updater = TaskUpdater(event_queue, task_id, context_id)
        if context.current_task is None and context.message is not None:
            await event_queue.enqueue_event(new_task_from_user_message(context.message))
        target = context.call_context.tenant or self.policy.default_agent or ""
        as_task = bool(self.policy.tasks_agent) and target == self.policy.tasks_agent
        if not as_task and not exposed(target, self.policy.patterns, self.policy.own):
            await self._end(updater, context, "FORBIDDEN", f"agent {target!r} is not served over A2A "
                            "here (a2a.expose), or the call named no agent (its tenant)")
            return
        message = context.message
        meta = dict(message.metadata) if message is not None else {}
        topic = str(meta.get("topic") or self.policy.topic)
        payload = payload_from_parts(message.parts) if message is not None else None
        notes: asyncio.Queue[str] = asyncio.Queue()

        def on_progress(note: str) -> None:
            if notes.qsize() >= NOTES_MAX:
                notes.get_nowait()
                self.notes_dropped += 1
            notes.put_nowait(note)

        await updater.start_work()
        budget = budget_of(context, self.policy)
        if as_task:  # a meshd task for the least-loaded agent with the capability
            call = asyncio.ensure_future(self._mesh_task(meta, payload, budget, on_progress))
        elif self.policy.through_tools:  # a held call's note becomes AUTH_REQUIRED (_note)
            call = asyncio.ensure_future(self.agent.call_tool("request_agent", {
                "agent": target, "topic": topic, "payload": payload, "timeout_s": budget},
                timeout=budget, on_progress=on_progress))
        else:
            call = asyncio.ensure_future(self.agent.request(
                target, topic, payload, timeout=budget,
                headers={"a2a-task": task_id, "a2a-context": context_id,
                         **trace_headers(context.call_context.state.get("headers") or {})},
                on_progress=on_progress))
        try:
            while not call.done():
                note = asyncio.ensure_future(notes.get())
                await asyncio.wait({call, note}, return_when=asyncio.FIRST_COMPLETED)
                if note.done():
                    await self._note(updater, context, note.result())
                else:
                    note.cancel()
            while not notes.empty():  # notes that came before the answer go out before it
                await self._note(updater, context, notes.get_nowait())
            result = call.result()
        except MeshError as exc:
            await self._end(updater, context, exc.code, exc.message, retry=exc.retryable,
                            retry_after=exc.retry_after)
            return
        finally:
            if not call.done():
                call.cancel()  # CancelTask (or the server stopping): the mesh request is cancelled
                with contextlib.suppress(asyncio.CancelledError, MeshError):
                    await call
        await updater.add_artifact(parts_from_payload(result), name="reply")
        await updater.complete()
        self._on_outcome("completed")

    async def _mesh_task(self, meta: dict[str, Any], payload: Any, budget: float,
                         on_progress: Callable[[str], None]) -> Any:
        """``create_task`` (or, with metadata ``plan``, ``create_plan``) then ``wait_task`` (the
        daemon's tools, so quotas apply): the result, or the failure typed; a cancel cancels the
        meshd task(s) too."""
        if meta.get("plan"):
            return await self._mesh_plan(payload, budget, on_progress)
        capability = meta.get("capability")
        if not isinstance(capability, str) or not capability:
            raise ValidationFailed(f"a message to {self.policy.tasks_agent!r} names the capability the "
                                   "task needs: message metadata 'capability' (or 'plan': true)")
        title = str(meta.get("title") or (payload if isinstance(payload, str) else "") or "an A2A task")
        record = await self.agent.call_tool("create_task", {
            "title": title[:200], "capability": capability, "input": payload, "deadline_s": budget},
            timeout=min(budget, 30.0))
        task_id = str(record.get("id"))
        on_progress(f"meshd task {task_id}: {record.get('state')}")
        try:
            return await self._finished(task_id, time.monotonic() + budget, budget, on_progress)
        except asyncio.CancelledError:
            self._cancel_meshd([task_id])
            raise

    async def _mesh_plan(self, payload: Any, budget: float, on_progress: Callable[[str], None]) -> Any:
        """A plan: the payload is ``create_plan``'s arguments (``tasks``, with ids, capabilities and
        deps; ``rounds``); the reply ``{"plan_id", "results": {task id in the plan: result}}``."""
        if not isinstance(payload, dict) or not isinstance(payload.get("tasks"), list):
            raise ValidationFailed("a plan is a data part {\"tasks\": [{\"id\", \"title\", \"capability\", "
                                   "\"input\", \"deps\"}, ...]} (docs/tasks.md)")
        args: dict[str, Any] = {"tasks": payload["tasks"], "deadline_s": budget}
        if "rounds" in payload:
            args["rounds"] = payload["rounds"]
        plan = await self.agent.call_tool("create_plan", args, timeout=min(budget, 30.0))
        plan_id, tasks = str(plan.get("id")), list(plan.get("tasks") or [])
        on_progress(f"meshd plan {plan_id}: {len(tasks)} tasks")
        end = time.monotonic() + budget
        waiting = [str(t.get("id")) for t in tasks]
        try:
            while waiting:
                await self._finished(waiting[0], end, budget, on_progress)
                waiting.pop(0)
        except asyncio.CancelledError:
            self._cancel_meshd(waiting)
            raise
        final = await self.agent.call_tool("task_status", {"plan_id": plan_id}, timeout=10.0)
        results = {str(t.get("key") or t.get("id")): t.get("result") for t in final.get("tasks") or []}
        return {"plan_id": plan_id, "state": final.get("state"), "results": results}

    async def _finished(self, task_id: str, end: float, budget: float,
                        on_progress: Callable[[str], None]) -> Any:
        """``wait_task`` in slices until the task ends (its notes to ``on_progress``): its result,
        or TaskFailed / Cancelled / RequestTimeout."""
        while (left := end - time.monotonic()) > 0:
            wait = min(left, TASK_WAIT_SLICE)
            done = await self.agent.call_tool("wait_task", {"task_id": task_id, "timeout_s": wait},
                                              timeout=wait + 5.0, on_progress=on_progress)
            state = done.get("state")
            if state == "done":
                return done.get("result")
            if state == "failed":
                raise TaskFailed(f"meshd task {task_id} failed: {done.get('error') or 'no reason given'}")
            if state == "cancelled":
                raise Cancelled(f"meshd task {task_id} was cancelled")
        raise RequestTimeout(f"meshd task {task_id} did not finish within {budget:g} s")

    def _cancel_meshd(self, task_ids: list[str]) -> None:
        """Cancel the meshd tasks an A2A task made (in the background: the A2A side is cancelled)."""
        for task_id in task_ids:
            cancel = asyncio.ensure_future(self.agent.call_tool("cancel_task", {"task_id": task_id},
                                                                timeout=10.0))
            self._cancelling.add(cancel)
            cancel.add_done_callback(self._cancel_done)

    def _cancel_done(self, task: asyncio.Future[Any]) -> None:
        self._cancelling.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.info("cancelling a meshd task failed: %s", task.exception())

    async def _note(self, updater: TaskUpdater, context: RequestContext, note: str) -> None:
        state: TaskState = TaskState.TASK_STATE_AUTH_REQUIRED if note.startswith(HELD_PREFIX) else \
            TaskState.TASK_STATE_WORKING
        await updater.update_status(state, message=_agent_message(context, [Part(text=note)]))

    async def _end(self, updater: TaskUpdater, context: RequestContext, code: str, text: str, *,
                   retry: bool = False, retry_after: float | None = None) -> None:
        state = state_for_error(code)
        await updater.update_status(state, message=_agent_message(
            context, error_parts(code, text, retry=retry, retry_after=retry_after)))
        self._on_outcome(TaskState.Name(state))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """``CancelTask``: the SDK cancels ``execute`` (and with it the mesh request) after this."""
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        await updater.cancel(_agent_message(context, [Part(text="cancelled by the A2A client")]))
        self._on_outcome("canceled")
