"""The system agent: the daemon's in-process agent that serves syscall tools to local agents.

Owns the path of a tool call, in this order: the caller is a local agent (the daemon stamped its
name) → the tool exists (NO_SUCH_TOOL) → the authorization hook allows it (FORBIDDEN) → the
caller's call quota (QUOTA_EXCEEDED) → the arguments validate (VALIDATION_FAILED naming the field;
nothing has happened yet) → for a tool with side effects, the approval hook or the config's policy
(APPROVAL_DENIED; or held for a person, bounded by the approval timeout and the caller's deadline)
→ the handler. It also owns the held-approval requests (``meshctl approvals``), the construction
of the task service and the spawner (meshd/tasks/, meshd/tools/spawn.py; absent ones make their tools
fail with NOT_WIRED) and the ``emit`` that carries their events to observers and to topic
``meshd.tasks``.

It talks to the node only through the :class:`SystemHost` attributes below and the public client
API (:class:`meshd.Agent` on the node's own agent socket). Must not touch routing or sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from meshd.client import DEFER, Agent, Message
from meshd.client.tracing import trace_headers
from meshd.errors import Forbidden, MeshError, NotWired, QuotaExceeded, StateFileError, ValidationFailed
from meshd.plugins.host import PluginHost
from meshd.plugins.policy import DENY, HOLD, Approvals, Authorizer, Quotas
from meshd.tools.registry import ToolContext, ToolRegistry, validate_args
from meshd.util.lazyimport import import_in_thread
from meshd.wire.system_names import (
    TOPIC_APPROVALS,
    TOPIC_CALL,
    TOPIC_LIST,
    TOPIC_TASK_EVENTS,
    system_agent_name,
)

if TYPE_CHECKING:  # meshd.config imports pydantic: not in the daemon's image (meshd/daemon/reexec.py)
    from meshd.config.settings import Settings

__all__ = ["SYSTEM_TOKEN_KEY", "SystemAgent", "SystemHost"]

log = logging.getLogger("meshd.tools")

#: Registration metadata key carrying the node's secret for the reserved name; the node removes it.
SYSTEM_TOKEN_KEY: Final = "meshd.sys.token"
_MAX_EVENT_PUBLISHES: Final = 1000  # task events being published at once; more are dropped, counted


class SystemHost(Protocol):
    """What the system agent needs from the daemon."""

    settings: Settings
    node_id: str
    socket_path: Path
    plugins: PluginHost

    def is_local_agent(self, name: str) -> bool:
        """Whether ``name`` is registered on this daemon (tool calls come from local agents only)."""
        ...

    def record_dead_letter(self, reason: str, detail: str, fields: dict[str, Any]) -> None:
        """Keep a dead letter that is not a message (a failed task): the FIFO and the hook."""
        ...


class SystemAgent:
    """Start with ``await start()`` once the node routes; ``await stop()`` before it closes sockets."""

    def __init__(self, node: SystemHost, token: str) -> None:
        self.node = node
        self.settings = node.settings
        self.token = token
        self.name = system_agent_name(node.node_id)
        self._registry = ToolRegistry()
        self._builtins_loaded = False
        self.approvals = Approvals(self.settings.tools)
        self.quotas = Quotas(self.settings.tools)
        self.authorizer = Authorizer(node.plugins.authorize if node.plugins.wants_authorize() else None)
        self.agent: Agent | None = None
        self.tasks: Any = None
        self.spawner: Any = None
        self.not_wired: dict[str, str] = {}
        self.services: dict[str, Any] = {"quotas": self.quotas, "authorizer": self.authorizer,
                                         "max_pending_asks": self.settings.tools.max_pending_asks}
        self.stats: dict[str, int] = {}
        self._publishing: set[asyncio.Task[Any]] = set()
        # set once the services are wired: a call that arrives while they start waits for them
        # (else a task tool would answer NOT_WIRED for a service that is about to run)
        self._started = asyncio.Event()

    # ----------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Collect the tools (a duplicate name raises ConfigError), attach, wire the services.

        Plugins' tools are collected now, after the built-in ones (a clash names both). With no
        plugin tools, the built-in ones (pydantic models) load at the first list or call: an idle
        daemon does not import pydantic for them (pydantic costs ~10 MiB)."""
        contributed = self.node.plugins.contributed_tools()
        if contributed:
            self._load_builtins()
            for plugin, tool in contributed:
                self._registry.add(tool, plugin)
        agent = Agent(self.name, socket=self.node.socket_path, metadata={SYSTEM_TOKEN_KEY: self.token},
                      max_payload_bytes=self.settings.max_payload_bytes)
        agent.on(TOPIC_LIST)(self._on_list)
        agent.on(TOPIC_CALL)(self._on_call)
        agent.on(TOPIC_APPROVALS)(self._on_approvals)
        await agent.connect()
        self.agent = agent
        await self._wire_tasks(agent)
        self._wire_spawner()
        self._started.set()
        log.info("system agent %s serves %s%s", self.name,
                 f"{len(self._registry)} tools ({', '.join(self._registry.names())})" if self._builtins_loaded
                 else "the built-in tools (loaded at the first list or call)",
                 "".join(f"; {k} not wired: {v}" for k, v in self.not_wired.items()))

    @property
    def registry(self) -> ToolRegistry:
        """Every tool this daemon serves (the built-in ones are loaded on first use)."""
        if not self._builtins_loaded:
            self._load_builtins()
        return self._registry

    async def _tools(self) -> ToolRegistry:
        """The registry, the built-in tools' models imported off the loop the first time."""
        if not self._builtins_loaded:
            await import_in_thread("meshd.tools.builtin")  # pydantic: ~0.3 s that must not stall routing
        return self.registry

    def _load_builtins(self) -> None:
        from meshd.tools.builtin import BUILTIN_PLUGIN_NAME, BuiltinTools  # pydantic models: only when used

        self._registry.add_all(BuiltinTools().meshd_tools(), BUILTIN_PLUGIN_NAME)
        self._builtins_loaded = True

    async def _wire_tasks(self, agent: Agent) -> None:
        try:
            from meshd.tasks.service import TaskService  # type: ignore[import-not-found,unused-ignore]
        except ImportError as exc:
            self.not_wired["tasks"] = f"meshd.tasks is not available ({exc})"
            return
        try:
            service = TaskService(agent, self.settings.state_dir / "tasks.db", self.settings, emit=self.emit)
            await service.start()
        except (sqlite3.DatabaseError, OSError) as exc:  # a corrupt or unusable tasks.db: exit 2
            raise StateFileError(self.settings.state_dir / "tasks.db",
                                 f"not a usable SQLite database ({exc})",
                                 "stop meshd, move the file (and its -wal and -shm files) aside, and start "
                                 "again: the tasks and plans in it are then forgotten; or restore it from "
                                 "a backup") from None
        except Exception as exc:
            log.exception("the task service failed to start; task tools will fail with NOT_WIRED")
            self.not_wired["tasks"] = f"the task service failed to start: {exc}"
            return
        self.tasks = service

    def _wire_spawner(self) -> None:
        try:
            # make_spawner: a meshd_spawner plugin's spawner (systemd-run, containers), else the
            # built-in Spawner
            from meshd.tools.spawn import make_spawner  # type: ignore[import-not-found,unused-ignore]
        except ImportError as exc:
            self.not_wired["spawn"] = f"meshd.tools.spawn is not available ({exc})"
            return
        try:
            self.spawner = make_spawner(self.settings, self.node.socket_path, self.emit, self.node.plugins)
        except Exception as exc:
            log.exception("the spawner failed to start; spawn_agent will fail with NOT_WIRED")
            self.not_wired["spawn"] = f"the spawner failed to start: {exc}"

    async def stop(self) -> None:
        """Deny held calls, stop the services and children, detach. Safe after a failed start."""
        for call in list(self.approvals.held.values()):
            if not call.decision.done():
                call.decision.set_result((False, "the daemon", "the daemon is stopping"))
        if self.tasks is not None:
            with contextlib.suppress(Exception):
                await self.tasks.stop()
        if self.spawner is not None:
            try:
                await self.spawner.stop_all()
            except Exception:
                log.exception("stopping spawned agents failed")
        for task in [*self.services.get("asks", ()), *self._publishing]:
            task.cancel()
        if self.agent is not None:
            await self.agent.close()

    # ----------------------------------------------------------------------------- events

    def emit(self, event: str, data: dict[str, Any]) -> None:
        """Task and spawn events: to observers (``meshd_task_event``, if a plugin host offers it)
        and published on topic ``meshd.tasks``; a ``task.failed`` marked ``dead_letter`` is also
        kept as a dead letter (reason TASK_FAILED). Never raises, never blocks."""
        if event == "task.failed" and data.get("dead_letter") is True:
            self._task_dead_letter(data)
        observe = getattr(self.node.plugins, "task_event", None)
        if callable(observe):
            try:
                observe(event, data)
            except Exception:
                log.debug("task event observer failed", exc_info=True)
        if self.agent is None or len(self._publishing) >= _MAX_EVENT_PUBLISHES:
            self._count("task_events_dropped")
            return
        task = asyncio.ensure_future(self._publish_event({"event": event, **data}))
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    def _task_dead_letter(self, data: dict[str, Any]) -> None:
        fields = {"kind": "task", "task_id": data.get("id"), "title": data.get("title"),
                  "capability": data.get("capability"), "error": data.get("error"),
                  "from": data.get("creator"), "to": data.get("assignee")}
        detail = (f"task {data.get('id')} {data.get('title')!r} (capability {data.get('capability')!r}) "
                  f"failed: {data.get('error')}")
        try:
            self.node.record_dead_letter("TASK_FAILED", detail, fields)
        except Exception:
            log.exception("recording the dead letter of task %s failed", data.get("id"))

    async def _publish_event(self, body: dict[str, Any]) -> None:
        assert self.agent is not None
        try:
            await self.agent.publish(TOPIC_TASK_EVENTS, body)
        except MeshError:
            self._count("task_events_dropped")

    def _tool_event(self, event: str, tool: str, caller: str, **extra: Any) -> None:
        self._count(f"tool_{event}")
        self.node.plugins.tool_event({"event": event, "tool": tool, "caller": caller,
                                      "node": self.node.node_id, "at": time.time(), **extra})

    def _count(self, key: str) -> None:
        self.stats[key] = self.stats.get(key, 0) + 1

    # ----------------------------------------------------------------------------- requests

    async def _wait_started(self, msg: Message) -> None:
        if self._started.is_set():
            return
        left = msg.time_left
        try:
            await asyncio.wait_for(self._started.wait(), None if left is None else max(left, 0.0))
        except TimeoutError:
            raise NotWired("the daemon's tool services are still starting") from None

    def _local_caller(self, msg: Message) -> str:
        caller = msg.sender
        if not self.node.is_local_agent(caller) or caller == self.name:
            raise Forbidden(f"agent {caller!r} is not attached to this daemon: call tools through "
                            "your own daemon")
        return caller

    async def _on_list(self, msg: Message) -> Any:
        fmt = msg.payload.get("format") if isinstance(msg.payload, dict) else None
        try:
            self._local_caller(msg)
            await self._wait_started(msg)
            registry = await self._tools()
            return registry.describe() if fmt is None else registry.schemas(str(fmt))
        except MeshError as exc:
            return await self._fail(msg, exc)

    async def _on_call(self, msg: Message) -> Any:
        body = msg.payload if isinstance(msg.payload, dict) else {}
        name = body.get("name")
        caller = msg.sender
        try:
            if not isinstance(msg.payload, dict):
                raise ValidationFailed("a tool call is a map {name, args}")
            caller = self._local_caller(msg)
            await self._wait_started(msg)
            result = await self.call(caller, name, body.get("args"), deadline=msg.deadline,
                                     progress=msg.progress, trace=trace_headers(msg.headers))
        except MeshError as exc:
            return await self._fail(msg, exc)
        return result

    async def call(self, caller: str, name: Any, raw_args: Any, *, deadline: float | None = None,
                   progress: Callable[[str], Awaitable[None]] | None = None,
                   trace: dict[str, str] | None = None) -> Any:
        """Run one tool call for ``caller`` through every check; raises typed errors.
        ``deadline`` is a ``time.monotonic()`` value of this host (``Message.deadline``), or None;
        ``progress(note)`` reaches the caller while the call takes long (a hold, the tool's notes)."""
        tool = (await self._tools()).get(name)
        try:
            self.authorizer.require("tool", caller, tool.name)
        except Forbidden as exc:
            self._tool_event("forbidden", tool.name, caller, reason=exc.message)
            raise
        try:
            self.quotas.count_call(caller, time.monotonic())
        except QuotaExceeded as exc:
            self._tool_event("quota_exceeded", tool.name, caller, reason=exc.message)
            raise
        args = validate_args(tool, raw_args)
        if tool.side_effects:
            await self._approve(tool.name, caller, args.model_dump(mode="json"), deadline, progress)
        ctx = ToolContext(caller=caller, agent=self._agent(), settings=self.settings, deadline=deadline,
                          tasks=self.tasks, spawner=self.spawner, services=self.services,
                          progress=progress, trace=trace or {})
        started = time.monotonic()
        try:
            result = await tool.handler(args, ctx)
        except MeshError as exc:
            self._tool_event("failed", tool.name, caller, error=exc.code,
                             ms=round((time.monotonic() - started) * 1000, 3))
            raise
        self._tool_event("called", tool.name, caller, ms=round((time.monotonic() - started) * 1000, 3))
        return result

    async def _approve(self, tool: str, caller: str, args: dict[str, Any], deadline: float | None,
                       progress: Callable[[str], Awaitable[None]] | None = None) -> None:
        answer = await self.node.plugins.approve_tool({"tool": tool, "caller": caller, "args": args,
                                                       "node": self.node.node_id})
        decision, reason = self.approvals.policy(tool, answer)
        if decision == DENY:
            self._tool_event("denied", tool, caller, reason=reason)
            from meshd.errors import ApprovalDenied

            raise ApprovalDenied(f"tool {tool!r}: {reason}")
        if decision != HOLD:
            return
        held = self.approvals.hold(tool, caller, args)
        self._tool_event("held", tool, caller, approval_id=held.id)
        log.info("tool call %s held for approval: %s by %s (meshctl approvals allow|deny %s)",
                 held.id, tool, caller, held.id)
        timeout = self.settings.tools.approval_timeout
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())  # Message.deadline is monotonic
        if progress is not None:  # the caller hears why it waits (MCP: a progress notification)
            await progress(f"held for approval {held.id}: meshctl approvals allow|deny {held.id} "
                           f"(within {max(timeout, 0.0):.0f} s)")
        try:
            by = await self.approvals.wait(held, timeout)
        except MeshError as exc:
            self._tool_event("denied", tool, caller, approval_id=held.id, reason=exc.message)
            raise
        self._tool_event("allowed", tool, caller, approval_id=held.id, reason=f"by {by}")

    async def _on_approvals(self, msg: Message) -> Any:
        body = msg.payload if isinstance(msg.payload, dict) else {}
        op = body.get("op")
        try:
            who = self._local_caller(msg)
            if op == "list":
                self.authorizer.require("approve", who, "*")
                return self.approvals.list()
            if op in ("allow", "deny"):
                approval_id = body.get("id")
                self.authorizer.require("approve", who, str(approval_id))
                return self.approvals.decide(approval_id, op == "allow", who, str(body.get("reason") or ""))
            raise ValidationFailed(f"unknown approvals op {op!r}: list, allow or deny")
        except MeshError as exc:
            return await self._fail(msg, exc)

    async def _fail(self, msg: Message, exc: MeshError) -> Any:
        assert self.agent is not None
        await self.agent.fail(msg, exc, code=exc.code)
        return DEFER

    def _agent(self) -> Agent:
        assert self.agent is not None, "the system agent is not attached"
        return self.agent
