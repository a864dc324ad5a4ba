"""The built-in tools, contributed through the ``meshd_tools`` hook like any plugin's.

Owns each built-in tool's argument model (its JSON Schema is what an LLM sees) and its handler.
Messaging tools act through the daemon's system agent and mark what they send with the
``meshd-caller`` header; task and spawn tools are thin wrappers over the task service and the
spawner (meshd/tasks/, meshd/tools/spawn.py) and raise :class:`NotWired` when those are not running,
never a silent no-op. Must not touch sockets or the node; approval, quotas and authorization of the
call itself are done before a handler runs (meshd/tools/service.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, model_validator

from meshd.client.gather import GATHER_MAX_TARGETS, pick_targets
from meshd.errors import MeshError, NoSuchAgent, NotWired, QueueFull
from meshd.hookspecs import hookimpl
from meshd.plugins.policy import Authorizer, Quotas
from meshd.tools.registry import Tool, ToolContext
from meshd.wire.system_names import CALLER_HEADER, TOPIC_ANSWER

__all__ = ["BUILTIN_PLUGIN_NAME", "BuiltinTools", "builtin_tools"]

BUILTIN_PLUGIN_NAME: Final = "meshd.builtin_tools"

_AGENT = Field(description="Agent name, or name@node to pick one node's agent.", min_length=1,
               max_length=260)
_TOPIC = Field(description="Topic the receiving agent's handler is selected by.", min_length=1,
               max_length=256)
_PRIORITY = Field(default=5, ge=0, le=9, description="0 (urgent, served first) to 9; default 5.")
_TERMINAL: Final = frozenset({"done", "failed", "cancelled"})
_WAIT_SLICE_S: Final = 2.0  # wait_task looks at its task this often, to tell the caller how it goes


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- messaging ----------------------------------------------------------------------------------


class AskAgentArgs(_Args):
    agent: str = _AGENT
    question: Any = Field(description="The question (text or any JSON value).")
    topic: str = Field(default="question", description="Topic the receiving agent handles questions on.",
                       min_length=1, max_length=256)
    timeout_s: float = Field(default=300.0, gt=0, description="Seconds the agent has to answer.")


class RequestAgentArgs(_Args):
    agent: str = _AGENT
    topic: str = _TOPIC
    payload: Any = Field(default=None, description="The request (any JSON value; for a typed topic, "
                                                   "what its contract's accepts schema describes).")
    timeout_s: float = Field(default=30.0, gt=0, description="Seconds to wait for the reply.")
    version: str | None = Field(default=None, pattern=r"^[0-9]{1,5}\.[0-9]{1,5}$",
                                description="The contract version the payload is written for "
                                            "(MAJOR.MINOR, as describe_agent lists it).")
    priority: int = _PRIORITY


class GatherAgentsArgs(_Args):
    topic: str = _TOPIC
    payload: Any = Field(default=None, description="The request every target gets (any JSON value).")
    agents: list[str] | None = Field(default=None, min_length=1, max_length=GATHER_MAX_TARGETS,
                                     description="The targets by name (or capability, or subscribers_of: "
                                     "exactly one of the three).")
    capability: str | None = Field(default=None, min_length=1, max_length=64,
                                   description="Every agent in the mesh with this capability.")
    subscribers_of: str | None = Field(default=None, min_length=1, max_length=256,
                                       description="Every agent subscribed to this topic (exactly or by a "
                                       "wildcard pattern).")
    want: int | None = Field(default=None, ge=1, le=GATHER_MAX_TARGETS,
                             description="Stop after this many replies (default: wait for every target).")
    timeout_s: float = Field(default=30.0, gt=0, description="Seconds to wait for the replies.")
    priority: int = _PRIORITY

    @model_validator(mode="after")
    def _one_selector(self) -> GatherAgentsArgs:
        if sum(x is not None for x in (self.agents, self.capability, self.subscribers_of)) != 1:
            raise ValueError("give exactly one of 'agents', 'capability' or 'subscribers_of'")
        return self


class ListAgentsArgs(_Args):
    capability: str | None = Field(default=None, description="Only agents with this capability, or "
                                                              "serving a typed topic (skill) of this name.")


class DescribeAgentArgs(_Args):
    agent: str = _AGENT


class SendMessageArgs(_Args):
    agent: str = _AGENT
    topic: str = _TOPIC
    payload: Any = Field(default=None, description="The message (any JSON value).")
    priority: int = _PRIORITY


class PublishArgs(_Args):
    topic: str = Field(description="Topic to publish on.", min_length=1, max_length=256)
    payload: Any = Field(default=None, description="The publication (any JSON value).")
    priority: int = _PRIORITY


# -- tasks and spawning -------------------------------------------------------------------------


class SpawnAgentArgs(_Args):
    template: str = Field(description="Name of an agent template declared in the daemon's config.",
                          min_length=1, max_length=64)
    name: str | None = Field(default=None, max_length=128,
                             description="Agent name for the child (default: from the template).")


class CreateTaskArgs(_Args):
    title: str = Field(description="Short title of the task.", min_length=1, max_length=200)
    capability: str = Field(description="Capability an agent needs to do it.", min_length=1, max_length=128)
    input: Any = Field(default=None, description="The task's input (any JSON value).")
    deadline_s: float | None = Field(default=None, gt=0, description="Seconds the task may take in all.")


class PlanTaskArgs(_Args):
    id: str = Field(description="Id of this task within the plan (deps refer to it).", min_length=1,
                    max_length=64)
    title: str = Field(description="Short title.", min_length=1, max_length=200)
    capability: str = Field(description="Capability an agent needs to do it.", min_length=1, max_length=128)
    input: Any = Field(default=None, description="The task's input; results of its deps are added.")
    deps: list[str] = Field(default_factory=list, description="Ids of tasks that must be done first.")


class CreatePlanArgs(_Args):
    tasks: list[PlanTaskArgs] = Field(description="The tasks; deps make a DAG (no cycles).", min_length=1)
    rounds: int = Field(default=1, ge=1, description="Re-plan rounds the plan may run (bounded by config).")
    deadline_s: float | None = Field(default=None, gt=0, description="Seconds the plan may take in all.")


class TaskStatusArgs(_Args):
    task_id: str | None = Field(default=None, description="A task id (from create_task or a plan).")
    plan_id: str | None = Field(default=None, description="A plan id (from create_plan).")


class WaitTaskArgs(_Args):
    task_id: str = Field(description="The task to wait for.", min_length=1)
    timeout_s: float = Field(default=60.0, gt=0, description="Seconds to wait at most.")


class ListTasksArgs(_Args):
    state: str | None = Field(default=None, description="Only tasks in this state (pending, ready, "
                              "running, done, failed, cancelled).")
    limit: int = Field(default=50, ge=1, le=1000, description="At most this many, newest first.")


class CancelTaskArgs(_Args):
    task_id: str = Field(description="The task to cancel.", min_length=1)


def _bounded(ctx: ToolContext, wanted: float) -> float:
    """A wait no longer than ``max_wait`` nor the caller's own deadline."""
    limit = min(wanted, ctx.settings.tools.max_wait)
    left = ctx.time_left(time.monotonic())
    return max(0.001, min(limit, left) if left is not None else limit)


def _authorizer(ctx: ToolContext) -> Authorizer | None:
    auth = ctx.services.get("authorizer")
    return auth if isinstance(auth, Authorizer) else None


def _may_message(ctx: ToolContext, agent: str, topic: str) -> None:
    auth = _authorizer(ctx)
    if auth is not None:
        auth.require("message", ctx.caller, agent, topic)


def _headers(ctx: ToolContext) -> dict[str, Any]:
    """A message a tool sends names its caller, and goes on in the caller's trace."""
    return {CALLER_HEADER: ctx.caller, **ctx.trace}


def _tasks(ctx: ToolContext, tool: str) -> Any:
    if ctx.tasks is None:
        raise NotWired(f"{tool}: the task service is not running on this daemon; nothing was done")
    return ctx.tasks


def _quotas(ctx: ToolContext) -> Quotas | None:
    quotas = ctx.services.get("quotas")
    return quotas if isinstance(quotas, Quotas) else None


def _is_open(tasks: Any) -> Any:
    def is_open(task_id: str) -> bool:
        try:
            return tasks.task_status(task_id).get("state") not in _TERMINAL
        except MeshError:
            return False
    return is_open


async def ask_agent(args: AskAgentArgs, ctx: ToolContext) -> dict[str, Any]:
    _may_message(ctx, args.agent, args.topic)
    pending: set[asyncio.Task[None]] = ctx.services.setdefault("asks", set())
    limit = int(ctx.services.get("max_pending_asks", 1000))
    if len(pending) >= limit:
        raise QueueFull(f"{len(pending)} ask_agent questions are waiting for answers (max {limit})")
    agent, caller = ctx.agent, ctx.caller
    timeout = min(args.timeout_s, ctx.settings.tools.max_wait)
    from meshd.wire.protocol import new_id

    question_id = new_id()

    async def ask() -> None:
        answer: dict[str, Any] = {"id": question_id, "agent": args.agent, "question": args.question}
        try:
            answer["answer"] = await agent.request(args.agent, args.topic, args.question, timeout=timeout,
                                                   headers=_headers(ctx))
        except MeshError as exc:
            answer["error"] = {"code": exc.code, "message": exc.message}
        try:
            await agent.send(caller, TOPIC_ANSWER, answer)
        except MeshError:
            pass  # the caller left; nobody to tell

    task = asyncio.create_task(ask(), name=f"meshd-ask-{question_id}")
    pending.add(task)
    task.add_done_callback(pending.discard)
    return {"accepted": True, "message_id": question_id,
            "note": f"the answer will arrive as a message on topic {TOPIC_ANSWER!r} with this id"}


async def request_agent(args: RequestAgentArgs, ctx: ToolContext) -> Any:
    _may_message(ctx, args.agent, args.topic)
    # The target's progress notes go on to the caller (MCP: progress notifications, which keep
    # a client from timing the call out).
    return await ctx.agent.request(args.agent, args.topic, args.payload,
                                   timeout=_bounded(ctx, args.timeout_s), headers=_headers(ctx),
                                   on_progress=ctx.progress, version=args.version,
                                   priority=args.priority)


async def gather_agents(args: GatherAgentsArgs, ctx: ToolContext) -> dict[str, Any]:
    records = [] if args.agents is not None else await ctx.agent.agents()
    targets = pick_targets(records, ctx.caller, to=args.agents, capability=args.capability,
                           subscribers_of=args.subscribers_of)
    for target in targets:  # each target is a message the caller must be allowed to send
        _may_message(ctx, target, args.topic)

    def note(target: str, text: str) -> Any:
        return ctx.note(f"{target}: {text}")

    replies, summary = await ctx.agent.gather(
        args.topic, args.payload, to=[t for t in targets if t != ctx.agent.name], want=args.want,
        timeout=_bounded(ctx, args.timeout_s), headers=_headers(ctx), on_progress=note,
        priority=args.priority).collect()
    return {"replies": [{"agent": r.sender, "reply": r.payload} for r in replies],
            "summary": summary.as_dict()}


async def list_agents(args: ListAgentsArgs, ctx: ToolContext) -> list[dict[str, Any]]:
    out = []
    for rec in await ctx.agent.agents():
        caps = list(rec.get("capabilities") or [])
        skills = skill_summaries(rec.get("contracts"))
        if args.capability is not None and args.capability not in caps and \
                args.capability not in {s["topic"] for s in skills}:
            continue
        raw = rec.get("telemetry")
        telemetry: dict[str, Any] = raw if isinstance(raw, dict) else {}
        out.append({
            "name": rec.get("name"), "node": rec.get("node"), "node_name": rec.get("node_name"),
            "capabilities": caps, "state": rec.get("state"),
            "context_used_pct": telemetry.get("context_used_pct"),
            "queue_depth": telemetry.get("queue_depth"),
            "tasks": telemetry.get("tasks_summary"),
            "telemetry": telemetry,
            "skills": skills,
        })
    return out


def skill_summaries(contracts: Any) -> list[dict[str, Any]]:
    """Topic, version and description of each contract record (describe_agent has the schemas)."""
    if not isinstance(contracts, list):
        return []
    return [{"topic": c.get("topic"), "version": c.get("version"), "description": c.get("description", "")}
            for c in contracts if isinstance(c, dict)]


async def describe_agent(args: DescribeAgentArgs, ctx: ToolContext) -> dict[str, Any]:
    name = args.agent.partition("@")[0]
    for rec in await ctx.agent.agents():
        if rec.get("name") == name:
            contracts = rec.get("contracts")
            return {"name": name, "node": rec.get("node"), "node_name": rec.get("node_name"),
                    "capabilities": list(rec.get("capabilities") or []), "state": rec.get("state"),
                    "skills": contracts if isinstance(contracts, list) else [],
                    "how_to_call": "request_agent with agent, topic = a skill's topic, payload = what its "
                                   "accepts schema describes, version = its version"}
    raise NoSuchAgent(f"no agent {name!r} in the mesh directory")


async def send_message(args: SendMessageArgs, ctx: ToolContext) -> dict[str, Any]:
    _may_message(ctx, args.agent, args.topic)
    msg_id = await ctx.agent.send(args.agent, args.topic, args.payload, headers=_headers(ctx),
                                  priority=args.priority)
    return {"sent": True, "message_id": msg_id}


async def publish(args: PublishArgs, ctx: ToolContext) -> dict[str, Any]:
    _may_message(ctx, "*", args.topic)
    reached = await ctx.agent.publish(args.topic, args.payload, headers=_headers(ctx), reach=True,
                                      priority=args.priority)
    return {"reached": reached}


async def spawn_agent(args: SpawnAgentArgs, ctx: ToolContext) -> dict[str, Any]:
    spawner = ctx.spawner
    if spawner is None:
        raise NotWired("spawn_agent: the spawner is not running on this daemon; nothing was started")
    quotas = _quotas(ctx)
    if quotas is not None:
        def alive(name: str) -> bool:
            return any(r.get("name") == name and r.get("state") in ("starting", "running", "restarting")
                       for r in spawner.list())
        quotas.check_spawn(ctx.caller, alive)
    record: dict[str, Any] = await spawner.spawn(args.template, requester=ctx.caller, name=args.name)
    if quotas is not None and isinstance(record.get("name"), str):
        quotas.add_spawn(ctx.caller, record["name"])
    return record


async def create_task(args: CreateTaskArgs, ctx: ToolContext) -> dict[str, Any]:
    tasks = _tasks(ctx, "create_task")
    quotas = _quotas(ctx)
    if quotas is not None:
        quotas.check_tasks(ctx.caller, 1, _is_open(tasks))
    record: dict[str, Any] = await tasks.create_task(creator=ctx.caller, title=args.title, input=args.input,
                                                     capability=args.capability, deadline_s=args.deadline_s,
                                                     trace=ctx.trace)
    if quotas is not None:
        quotas.add_tasks(ctx.caller, [str(record.get("id"))])
    return record


async def create_plan(args: CreatePlanArgs, ctx: ToolContext) -> dict[str, Any]:
    tasks = _tasks(ctx, "create_plan")
    quotas = _quotas(ctx)
    if quotas is not None:
        quotas.check_tasks(ctx.caller, len(args.tasks), _is_open(tasks))
    plan: dict[str, Any] = await tasks.create_plan(
        creator=ctx.caller, tasks=[t.model_dump() for t in args.tasks], rounds=args.rounds,
        deadline_s=args.deadline_s, trace=ctx.trace)
    if quotas is not None:
        ids = plan.get("task_ids") or [t.get("id") for t in plan.get("tasks") or [] if isinstance(t, dict)]
        quotas.add_tasks(ctx.caller, [str(i) for i in ids])
    return plan


async def task_status(args: TaskStatusArgs, ctx: ToolContext) -> dict[str, Any]:
    tasks = _tasks(ctx, "task_status")
    if (args.task_id is None) == (args.plan_id is None):
        from meshd.errors import ValidationFailed

        raise ValidationFailed("tool 'task_status': field 'task_id': give exactly one of task_id or plan_id",
                               details={"field": "task_id"})
    if args.plan_id is not None:
        return dict(tasks.plan_status(args.plan_id))
    return dict(tasks.task_status(args.task_id))


async def wait_task(args: WaitTaskArgs, ctx: ToolContext) -> dict[str, Any]:
    tasks = _tasks(ctx, "wait_task")
    end = time.monotonic() + _bounded(ctx, args.timeout_s)
    seen: tuple[Any, Any] | None = None
    while True:  # in slices, so the caller hears how the task goes (progress notes)
        left = end - time.monotonic()
        record = dict(await tasks.wait_task(args.task_id, max(min(left, _WAIT_SLICE_S), 0.001)))
        if record.get("state") in _TERMINAL or left <= _WAIT_SLICE_S:
            return record
        now = (record.get("state"), record.get("assignee"))
        if now != seen:
            seen = now
            await ctx.note(f"task {args.task_id}: {now[0]}" + (f" (assignee {now[1]})" if now[1] else ""))


async def list_tasks(args: ListTasksArgs, ctx: ToolContext) -> list[dict[str, Any]]:
    tasks = _tasks(ctx, "list_tasks")
    return list(tasks.list_tasks(state=args.state, limit=args.limit))


async def cancel_task(args: CancelTaskArgs, ctx: ToolContext) -> dict[str, Any]:
    tasks = _tasks(ctx, "cancel_task")
    return dict(tasks.cancel_task(args.task_id, by=ctx.caller))


def builtin_tools() -> list[Tool]:
    """Every built-in tool."""
    return [
        Tool("ask_agent", "Hand a question to a named agent. Returns at once with accepted and the "
             "message id, not the answer; the answer arrives later as a message on topic "
             f"'{TOPIC_ANSWER}' (read it with wait_message over MCP).", AskAgentArgs, ask_agent,
             side_effects=True),
        Tool("request_agent", "Ask a named agent and wait for its reply (bounded by timeout_s).",
             RequestAgentArgs, request_agent, side_effects=True),
        Tool("gather_agents", "Ask several agents at once (by names, a capability, or the subscribers of "
             "a topic) and wait for their replies, up to want of them or timeout_s; returns the replies "
             "and who replied, failed, timed out or was unreachable.", GatherAgentsArgs, gather_agents,
             side_effects=True),
        Tool("list_agents", "List the agents in the mesh: name, node, capabilities, the skills (typed "
             "topics) each serves, state and live telemetry (context use %, queue depth, what it is "
             "doing).", ListAgentsArgs, list_agents),
        Tool("describe_agent", "What one agent accepts: each skill (typed topic) with its version, "
             "description, the JSON Schema of its payload (accepts) and reply (returns), and examples; "
             "call a skill with request_agent.", DescribeAgentArgs, describe_agent),
        Tool("send_message", "Send a message to a named agent without waiting for an answer.",
             SendMessageArgs, send_message, side_effects=True),
        Tool("publish", "Publish on a topic; returns how many subscribers it reached.", PublishArgs,
             publish, side_effects=True),
        Tool("spawn_agent", "Start an agent from a template declared in the daemon's config "
             "(supervised by the daemon, within quotas).", SpawnAgentArgs, spawn_agent, side_effects=True),
        Tool("create_task", "Create a task for the least-loaded online agent with the capability; "
             "returns the task record (poll with task_status or wait_task).", CreateTaskArgs, create_task,
             side_effects=True),
        Tool("create_plan", "Create a plan: tasks with capabilities and dependencies (a DAG). It is "
             "checked first (cycles, unknown deps, size); each task runs when its deps are done and "
             "gets their results.", CreatePlanArgs, create_plan, side_effects=True),
        Tool("task_status", "The state of a task (or of a plan, with plan_id), and why it waits.",
             TaskStatusArgs, task_status),
        Tool("wait_task", "Wait until a task is done, failed or cancelled (bounded by timeout_s); "
             "returns its record.", WaitTaskArgs, wait_task),
        Tool("list_tasks", "List the tasks this daemon owns (state, assignee, attempts).", ListTasksArgs,
             list_tasks),
        Tool("cancel_task", "Cancel a task that has not finished.", CancelTaskArgs, cancel_task,
             side_effects=True),
    ]


class BuiltinTools:
    """The plugin object that contributes the built-in tools (registered by the system agent)."""

    @hookimpl
    def meshd_tools(self) -> list[Tool]:
        return builtin_tools()
