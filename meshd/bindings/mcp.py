"""``meshd mcp``: a stdio MCP server, on the official ``mcp`` SDK, that attaches to the local daemon
as an agent, so any MCP client (Claude Desktop, Claude Code, ...) uses the mesh with no code.

Owns the bridge between MCP and the public client API: MCP tools are the daemon's tools (listed
and called through :meth:`meshd.Agent.tools` / :meth:`meshd.Agent.call_tool`, so approval, quotas
and authorization apply as to any agent) plus two of its own, ``wait_message`` and
``reply_message``, so the LLM can read what arrives for this agent and answer requests. Resources:
``meshd://agents`` (the agent directory with live telemetry), ``meshd://tasks`` (the daemon's
tasks) and ``meshd://tools``. Must not import the node or the tool machinery; the SDK is imported
only here, and only when the server runs (it is the ``mcp`` extra).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from meshd.bindings.attached import run_attached
from meshd.bindings.mcp_skills import SkillTools
from meshd.client import DEFER, Agent, Message
from meshd.client.handlers import ANY_TOPIC
from meshd.errors import ConfigError, MeshError, NoSuchTool, QueueFull, ValidationFailed

__all__ = ["INBOX_URI", "MCP_EXTRA_HINT", "RESOURCES", "McpOptions", "MeshMcpBridge", "run_mcp_server",
           "summary"]

log = logging.getLogger("meshd.mcp")

CALL_TIMEOUT: Final = 125.0  # a call with no timeout_s: the default approval_timeout (120 s) and a little
SKILL_TIMEOUT: Final = 60.0  # a call of a skill tool: a request to that agent, bounded
TIMEOUT_GRACE: Final = 0.5  # a tool's timeout_s plus this, for its answer to travel back
MCP_EXTRA_HINT: Final = "the MCP server needs the 'mcp' extra: pip install 'meshd-daemon[mcp]'"

_WAIT_SCHEMA: Final = {
    "type": "object",
    "properties": {"timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 600, "default": 30,
                                 "description": "Seconds to wait for a message."}},
    "additionalProperties": False,
}
_REPLY_SCHEMA: Final = {
    "type": "object",
    "properties": {"id": {"type": "string", "description": "The id of a request from wait_message."},
                   "payload": {"description": "The answer (any JSON value)."}},
    "required": ["id"],
    "additionalProperties": False,
}
LOCAL_TOOLS: Final = {
    "wait_message": ("Wait for the next message that arrives for this agent (requests, messages, "
                     "answers to ask_agent). Returns it, or null after timeout_s. A request must be "
                     "answered with reply_message.", _WAIT_SCHEMA),
    "reply_message": ("Answer a request received with wait_message.", _REPLY_SCHEMA),
}
INBOX_URI: Final = "meshd://inbox"
RESOURCES: Final = {
    INBOX_URI: ("inbox", "Messages that arrived for this agent and are not read yet (wait_message "
                "takes them); subscribe for notifications/resources/updated on each arrival."),
    "meshd://agents": ("agents", "Agents in the mesh: capabilities, state, context %, queue depth."),
    "meshd://tasks": ("tasks", "Tasks this daemon owns, newest first."),
    "meshd://tools": ("tools", "The daemon's tools with their JSON Schemas."),
}


class MeshMcpBridge:
    """The agent side of the MCP server: tools, messages and resources as plain data (no SDK).

    ``listeners`` are called (synchronously, never raising into the agent) with ``"arrived"``
    and the message's summary when a message lands in the inbox, and with ``"read"`` and None
    when ``wait_message`` takes one: the server turns them into resource-updated and pushed
    notifications (meshd/bindings/mcp_server.py)."""

    def __init__(self, agent: Agent, inbox_cap: int = 100, *, skills_max: int = 64,
                 skills_allow: tuple[str, ...] = ()) -> None:
        self.agent = agent
        #: The mesh's typed topics as tools of their own (meshd/bindings/mcp_skills.py).
        self.skills = SkillTools(agent, max_tools=skills_max, allow=skills_allow)
        self.inbox_cap = inbox_cap
        self.inbox: collections.deque[Message] = collections.deque()
        self.open_requests: collections.OrderedDict[str, Message] = collections.OrderedDict()
        self.dropped = 0
        self.listeners: list[Callable[[str, dict[str, Any] | None], None]] = []
        self._arrived = asyncio.Event()
        self._failing: set[asyncio.Task[None]] = set()
        self._wait_defaults: dict[str, float] | None = None  # tool name -> its timeout_s default
        agent.on(ANY_TOPIC)(self._on_message)

    def _on_message(self, msg: Message) -> Any:
        if len(self.inbox) >= self.inbox_cap:
            self.dropped += 1
            if msg.is_request:
                err = QueueFull(f"agent {self.agent.name!r} (an MCP client) has {self.inbox_cap} unread "
                                "messages; try later")
                task = asyncio.ensure_future(self.agent.fail(msg, err.message, code=err.code))
                self._failing.add(task)
                task.add_done_callback(self._failing.discard)
                return DEFER
            return None
        self.inbox.append(msg)
        self._arrived.set()
        self._tell("arrived", summary(msg))
        return DEFER if msg.is_request else None

    def _tell(self, event: str, item: dict[str, Any] | None) -> None:
        for listener in list(self.listeners):
            try:
                listener(event, item)
            except Exception:
                log.exception("an inbox listener raised")

    async def tool_list(self) -> list[dict[str, Any]]:
        """Every tool as ``{name, description, inputSchema}``: the daemon's, then the local ones."""
        tools = await self.agent.tools(format="mcp")
        self._wait_defaults = {str(t.get("name")): float(d) for t in tools
                               if isinstance(d := _timeout_default(t.get("inputSchema")), int | float)}
        tools.extend({"name": name, "description": text, "inputSchema": schema}
                     for name, (text, schema) in LOCAL_TOOLS.items())
        with contextlib.suppress(MeshError):
            await self.skills.refresh()
        taken = {t.get("name") for t in tools}
        tools.extend(t for t in self.skills.tools() if t["name"] not in taken)
        return tools

    async def call_timeout(self, name: str, args: dict[str, Any]) -> float:
        """How long this side waits for a call: a tool that waits (``timeout_s``, given or its
        schema's default) gets that and a little, so no call outlives its ``timeout_s`` (issue
        22); any other call gets the default approval timeout and a little, so a call held for a
        person can be decided before this side gives up."""
        wanted = args.get("timeout_s")
        if not isinstance(wanted, int | float) or isinstance(wanted, bool) or wanted <= 0:
            if self._wait_defaults is None:
                with contextlib.suppress(MeshError):
                    await self.tool_list()
            wanted = (self._wait_defaults or {}).get(name)
        return float(wanted) + TIMEOUT_GRACE if wanted else CALL_TIMEOUT

    async def call(self, name: str, args: dict[str, Any], *,
                   on_progress: Callable[[str], Any] | None = None,
                   headers: dict[str, Any] | None = None) -> Any:
        """Call a tool; raises typed errors. ``on_progress(note)`` sees the daemon's notes;
        ``headers``: the client's trace context (``_meta.traceparent``) as mesh headers."""
        if name == "wait_message":
            return await self.wait_message(float(args.get("timeout_s", 30)))
        if name == "reply_message":
            return await self.reply_message(args.get("id"), args.get("payload"))
        skill = self.skills.skills.get(name)
        if skill is not None:  # a typed topic of a mesh agent: a request with its contract's version
            return await self.agent.request(skill.agent, skill.topic, skill.payload(args),
                                            version=skill.version, timeout=SKILL_TIMEOUT,
                                            on_progress=on_progress, headers=headers)
        return await self.agent.call_tool(name, args, timeout=await self.call_timeout(name, args),
                                          on_progress=on_progress, headers=headers)

    async def wait_message(self, timeout_s: float) -> dict[str, Any] | None:
        if not 0 < timeout_s <= 600:
            raise ValidationFailed("tool 'wait_message': field 'timeout_s': must be > 0 and <= 600")
        if not self.inbox:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout_s)
            except TimeoutError:
                return None
        msg = self.inbox.popleft()
        if msg.is_request:
            self.open_requests[msg.id] = msg
            while len(self.open_requests) > self.inbox_cap:  # bounded: the oldest unanswered one fails
                _, old = self.open_requests.popitem(last=False)
                await self.agent.fail(old, "the MCP client did not answer in time", code="TIMEOUT")
        self._tell("read", None)
        return summary(msg)

    def inbox_view(self) -> dict[str, Any]:
        """The ``meshd://inbox`` resource: the unread messages (oldest first), not taken."""
        return {"agent": self.agent.name, "unread": len(self.inbox), "cap": self.inbox_cap,
                "dropped": self.dropped, "messages": [summary(m) for m in self.inbox]}

    async def reply_message(self, msg_id: Any, payload: Any) -> dict[str, Any]:
        msg = self.open_requests.pop(msg_id, None) if isinstance(msg_id, str) else None
        if msg is None:
            raise ValidationFailed(f"tool 'reply_message': field 'id': no open request {msg_id!r}")
        await self.agent.reply(msg, payload)
        return {"replied": True, "to": msg.reply_to or msg.sender}

    async def read_resource(self, uri: str) -> Any:
        kind = RESOURCES.get(uri, ("", ""))[0]
        if kind == "inbox":
            return self.inbox_view()
        if kind == "agents":
            return await self.agent.call_tool("list_agents", {})
        if kind == "tasks":
            return await self.agent.call_tool("list_tasks", {"limit": 200})
        if kind == "tools":
            return await self.agent.tools()
        if uri.startswith("meshd://tasks/"):
            return await self.agent.call_tool("task_status", {"task_id": uri.removeprefix("meshd://tasks/")})
        raise NoSuchTool(f"no resource {uri!r}; known: {', '.join(RESOURCES)}")


def summary(msg: Message) -> dict[str, Any]:
    """A message as ``wait_message`` returns it (and ``meshd://inbox`` lists it)."""
    return {"id": msg.id, "kind": msg.kind, "from": msg.sender, "topic": msg.topic,
            "payload": msg.payload, "is_request": msg.is_request, "time_left_s": msg.time_left,
            "tasks": getattr(msg, "tasks", None)}


def _timeout_default(schema: Any) -> Any:
    props = schema.get("properties") if isinstance(schema, dict) else None
    spec = props.get("timeout_s") if isinstance(props, dict) else None
    return spec.get("default") if isinstance(spec, dict) else None


@dataclass(frozen=True, slots=True)
class McpOptions:
    """``meshd mcp``'s options (meshd/cli/main.py fills them from its flags).

    ``http``: serve Streamable HTTP on ``HOST:PORT`` (meshd/bindings/mcp_http.py) instead of
    stdio; ``progress_every``: seconds between keep-alive progress notifications of a running
    call; ``push``: announce each arrival with ``notifications/claude/channel`` too."""

    socket: Path | None = None
    name: str | None = None
    capabilities: tuple[str, ...] = ()
    inbox_cap: int = 100
    progress_every: float = 5.0
    push: bool = False
    http: str | None = None
    token_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    allowed_origins: tuple[str, ...] = ()
    #: Typed topics of the mesh shown as tools of their own (0: none), and the shell patterns
    #: (on the tool name ``agent__topic`` or the agent name) of those shown; empty: all.
    skills_max: int = 64
    skills_allow: tuple[str, ...] = ()


async def _serve(opts: McpOptions, name: str) -> None:
    from meshd.bindings.mcp_server import build_server

    async with Agent(name, socket=opts.socket, capabilities=list(opts.capabilities)) as agent:
        bridge = MeshMcpBridge(agent, opts.inbox_cap, skills_max=opts.skills_max,
                               skills_allow=opts.skills_allow)
        server, _ = build_server(bridge, f"meshd ({name})", progress_every=opts.progress_every,
                                 push=opts.push)
        watch = asyncio.ensure_future(bridge.skills.watch())  # tools/list_changed when skills change
        log.info("MCP server attached to meshd as %r (node %s)", name, agent.node_name)
        try:
            if opts.http is not None:
                from meshd.bindings.mcp_http import serve_http

                await serve_http(server, opts, name)
                return
            from mcp.server.stdio import stdio_server

            async with stdio_server() as (read_stream, write_stream):
                await server.run(read_stream, write_stream, server.create_initialization_options())
        finally:
            watch.cancel()


def run_mcp_server(opts: McpOptions) -> int:
    """``meshd mcp``: serve MCP on stdin/stdout until the client closes it, or on Streamable
    HTTP until SIGINT/SIGTERM; returns the exit code (2: the extra is missing or an option is bad)."""
    if not 0 < opts.progress_every <= 600:
        print("meshd mcp: --progress-every: must be > 0 and <= 600 seconds", file=sys.stderr)
        return 2
    if opts.http is not None:
        from meshd.bindings.mcp_http import check_http

        try:
            check_http(opts)  # a bad address or TLS file stops here, before anything attaches or binds
        except ConfigError as exc:
            print(f"meshd mcp: {exc}", file=sys.stderr)
            return 2
    try:
        import mcp  # noqa: F401
    except ImportError:
        print(f"meshd: {MCP_EXTRA_HINT}", file=sys.stderr)
        return 2
    return run_attached("meshd mcp", "meshd.mcp", _serve(opts, opts.name or f"mcp-{os.getpid()}"))
