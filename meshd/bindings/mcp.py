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
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from meshd.client import DEFER, Agent, Message
from meshd.client.handlers import ANY_TOPIC
from meshd.errors import MeshError, NoSuchTool, QueueFull, ValidationFailed

__all__ = ["MCP_EXTRA_HINT", "MeshMcpBridge", "run_mcp_server"]

log = logging.getLogger("meshd.mcp")

CALL_TIMEOUT: Final = 125.0
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
RESOURCES: Final = {
    "meshd://agents": ("agents", "Agents in the mesh: capabilities, state, context %, queue depth."),
    "meshd://tasks": ("tasks", "Tasks this daemon owns, newest first."),
    "meshd://tools": ("tools", "The daemon's tools with their JSON Schemas."),
}


@dataclass(slots=True)
class _Inbound:
    message: Message
    answered: bool = False


class MeshMcpBridge:
    """The agent side of the MCP server: tools, messages and resources as plain data (no SDK)."""

    def __init__(self, agent: Agent, inbox_cap: int = 100) -> None:
        self.agent = agent
        self.inbox_cap = inbox_cap
        self.inbox: collections.deque[Message] = collections.deque()
        self.open_requests: collections.OrderedDict[str, Message] = collections.OrderedDict()
        self.dropped = 0
        self._arrived = asyncio.Event()
        self._failing: set[asyncio.Task[None]] = set()
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
        return DEFER if msg.is_request else None

    async def tool_list(self) -> list[dict[str, Any]]:
        """Every tool as ``{name, description, inputSchema}``: the daemon's, then the local ones."""
        tools = await self.agent.tools(format="mcp")
        tools.extend({"name": name, "description": text, "inputSchema": schema}
                     for name, (text, schema) in LOCAL_TOOLS.items())
        return tools

    async def call(self, name: str, args: dict[str, Any]) -> Any:
        """Call a tool; raises typed errors."""
        if name == "wait_message":
            return await self.wait_message(float(args.get("timeout_s", 30)))
        if name == "reply_message":
            return await self.reply_message(args.get("id"), args.get("payload"))
        # A tool that waits (request_agent, wait_task) gets its own wait plus a margin; every call
        # gets at least the default approval_timeout (120 s) and a little, so a held call can be
        # decided by a person before this side gives up.
        wanted = args.get("timeout_s")
        timeout = float(wanted) + 5 if isinstance(wanted, int | float) and wanted > 0 else 0.0
        return await self.agent.call_tool(name, args, timeout=max(CALL_TIMEOUT, timeout))

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
        return {"id": msg.id, "kind": msg.kind, "from": msg.sender, "topic": msg.topic,
                "payload": msg.payload, "is_request": msg.is_request, "time_left_s": msg.time_left,
                "tasks": getattr(msg, "tasks", None)}

    async def reply_message(self, msg_id: Any, payload: Any) -> dict[str, Any]:
        msg = self.open_requests.pop(msg_id, None) if isinstance(msg_id, str) else None
        if msg is None:
            raise ValidationFailed(f"tool 'reply_message': field 'id': no open request {msg_id!r}")
        await self.agent.reply(msg, payload)
        return {"replied": True, "to": msg.reply_to or msg.sender}

    async def read_resource(self, uri: str) -> Any:
        kind = RESOURCES.get(uri, ("", ""))[0]
        if kind == "agents":
            return await self.agent.call_tool("list_agents", {})
        if kind == "tasks":
            return await self.agent.call_tool("list_tasks", {"limit": 200})
        if kind == "tools":
            return await self.agent.tools()
        if uri.startswith("meshd://tasks/"):
            return await self.agent.call_tool("task_status", {"task_id": uri.removeprefix("meshd://tasks/")})
        raise NoSuchTool(f"no resource {uri!r}; known: {', '.join(RESOURCES)}")


def _text(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


def build_server(bridge: MeshMcpBridge, name: str) -> Any:
    """The SDK's low-level ``Server`` with handlers over ``bridge``."""
    import mcp_types as types
    from mcp.server.lowlevel import Server

    async def list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(tools=[types.Tool(name=t["name"], description=t["description"],
                                                       input_schema=t["inputSchema"])
                                            for t in await bridge.tool_list()])

    async def call_tool(ctx: Any, params: Any) -> Any:
        try:
            result = await bridge.call(params.name, dict(params.arguments or {}))
        except MeshError as exc:
            return types.CallToolResult(content=[types.TextContent(text=f"{exc.code}: {exc.message}")],
                                        is_error=True)
        return types.CallToolResult(content=[types.TextContent(text=_text(result))],
                                    structured_content={"result": result})

    async def list_resources(ctx: Any, params: Any) -> Any:
        return types.ListResourcesResult(resources=[
            types.Resource(uri=uri, name=kind, description=text, mime_type="application/json")
            for uri, (kind, text) in RESOURCES.items()])

    async def read_resource(ctx: Any, params: Any) -> Any:
        uri = str(params.uri)
        try:
            text = _text(await bridge.read_resource(uri))
        except MeshError as exc:
            text = _text({"error": exc.code, "message": exc.message})
        return types.ReadResourceResult(contents=[types.TextResourceContents(
            uri=uri, mime_type="application/json", text=text)])

    return Server(name, version="1", instructions=(
        "meshd: this server is an agent on a peer mesh. list_agents shows who is there and how "
        "loaded; request_agent asks one and waits; create_task / create_plan hand work to agents "
        "by capability; wait_message reads what arrives for you, reply_message answers requests."),
        on_list_tools=list_tools, on_call_tool=call_tool, on_list_resources=list_resources,
        on_read_resource=read_resource)


async def _serve(socket: Path | None, name: str, capabilities: list[str], inbox_cap: int) -> None:
    from mcp.server.stdio import stdio_server

    async with Agent(name, socket=socket, capabilities=capabilities) as agent:
        bridge = MeshMcpBridge(agent, inbox_cap)
        server = build_server(bridge, f"meshd ({name})")
        log.info("MCP server attached to meshd as %r (node %s)", name, agent.node_name)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())


def run_mcp_server(socket: Path | None, name: str | None, capabilities: list[str] | None = None,
                   inbox_cap: int = 100) -> int:
    """``meshd mcp``: serve MCP on stdin/stdout until the client closes it; returns the exit code."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        print(f"meshd: {MCP_EXTRA_HINT}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="meshd mcp: %(message)s")
    try:
        asyncio.run(_serve(socket, name or f"mcp-{os.getpid()}", list(capabilities or []), inbox_cap))
    except MeshError as exc:
        print(f"meshd mcp: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0
