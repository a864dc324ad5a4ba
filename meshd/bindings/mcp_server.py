"""The MCP side of ``meshd mcp``: the official SDK's low-level ``Server`` over a :class:`MeshMcpBridge`.

Owns what MCP clients see besides the data: progress notifications while a tool call runs (the
daemon's notes relayed, and a keep-alive every ``progress_every`` seconds, so a client that resets
its timeout on progress never times a long call out), cancellation (the SDK cancels the handler
when ``notifications/cancelled`` comes; the mesh request is cancelled with it), and the inbox's
announcements (:class:`InboxAnnouncer`): ``notifications/resources/updated`` for ``meshd://inbox``
to the sessions that subscribed (2025 handshake era: ``resources/subscribe``; 2026 era: a
``subscriptions/listen`` stream), and, with ``push``, ``notifications/claude/channel`` to every
session (the channel notification Claude Code listens for; its capability is declared as
``experimental["claude/channel"]``). Transports live in meshd/bindings/mcp.py (stdio) and
meshd/bindings/mcp_http.py (Streamable HTTP). Must not touch the agent's sockets; the SDK is
imported only when a server is built.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from meshd.bindings.mcp import INBOX_URI, RESOURCES, MeshMcpBridge
from meshd.client.tracing import trace_headers
from meshd.errors import MeshError, NoSuchTool

__all__ = ["CHANNEL_CAPABILITY", "CHANNEL_METHOD", "MAX_WATCHERS", "InboxAnnouncer", "ProgressRelay",
           "build_server"]

log = logging.getLogger("meshd.mcp")

CHANNEL_CAPABILITY: Final = "claude/channel"
CHANNEL_METHOD: Final = "notifications/claude/channel"
#: Sessions the announcer keeps (subscribers of meshd://inbox, sessions pushed to); one more
#: subscription is refused with an MCP error, and pushes reach the newest sessions.
MAX_WATCHERS: Final = 256
RESOURCE_NOT_FOUND: Final = -32002  # the MCP spec's error code for an unknown resource URI
_SEND_TIMEOUT_S: Final = 5.0  # a notification a session cannot take within this is dropped


def _trace_of(params: Any) -> dict[str, Any] | None:
    """The W3C trace context an MCP client put in the call's ``_meta`` (``traceparent``,
    ``tracestate``), as mesh headers; None when there is none."""
    meta = getattr(params, "meta", None)
    if meta is not None and not isinstance(meta, dict):
        meta = meta.model_dump(by_alias=True) if hasattr(meta, "model_dump") else None
    return (trace_headers(meta) or None) if isinstance(meta, dict) else None


def _text(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


class ProgressRelay:
    """Progress notifications for one tool call, against the client's ``progressToken``.

    ``note(text)`` relays a daemon note at once; :meth:`run` sends a keep-alive every ``every``
    seconds while the call runs. ``report`` is the SDK's ``session.report_progress`` (a no-op when
    the client sent no token). Progress values only grow (the spec's rule)."""

    def __init__(self, report: Callable[[float, float | None, str | None], Awaitable[None]],
                 every: float) -> None:
        self._report = report
        self._every = every
        self._count = 0
        self._last = "working"
        self._started = time.monotonic()
        self.sent = 0

    async def note(self, text: str) -> None:
        self._last = text
        await self._send(text)

    async def _send(self, text: str) -> None:
        self._count += 1
        try:
            await self._report(float(self._count), None, text)
            self.sent += 1
        except Exception:  # the request ended or the stream broke: progress is best effort
            log.debug("a progress notification was not sent", exc_info=True)

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            await self._send(f"{self._last} ({time.monotonic() - self._started:.0f} s)")

    async def run(self, call: Awaitable[Any]) -> Any:
        beat = asyncio.ensure_future(self._keepalive())
        try:
            return await call
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat


class InboxAnnouncer:
    """Tells MCP sessions that a message arrived, without polling.

    Sessions are kept by connection (bounded by :data:`MAX_WATCHERS`) and forgotten when their
    connection closes or a send to them fails."""

    def __init__(self, bridge: MeshMcpBridge, *, push: bool, bus: Any) -> None:
        self.push = push
        self._bus = bus  # the SDK's SubscriptionBus, for 2026-era listen streams
        self._subscribed: collections.OrderedDict[int, Any] = collections.OrderedDict()
        self._sessions: collections.OrderedDict[int, Any] = collections.OrderedDict()
        self._sending: set[asyncio.Task[None]] = set()
        self._listing: collections.OrderedDict[int, Any] = collections.OrderedDict()
        self.sent = {"updated": 0, "pushed": 0, "dropped": 0, "tools_changed": 0}
        bridge.listeners.append(self._on_inbox)
        bridge.skills.listeners.append(self._on_skills)

    @staticmethod
    def _key(session: Any) -> tuple[int, Any]:
        # The SDK makes a ServerSession per request; the connection behind it is what lasts.
        conn = getattr(session, "_connection", None)
        return (id(conn) if conn is not None else id(session)), conn

    def _watch(self, table: collections.OrderedDict[int, Any], session: Any) -> bool:
        key, conn = self._key(session)
        if key in table:
            return True
        if len(table) >= MAX_WATCHERS:
            return False
        table[key] = session
        stack = getattr(conn, "exit_stack", None)
        if stack is not None:
            stack.callback(table.pop, key, None)
        return True

    def seen(self, session: Any) -> None:
        """A session spoke to us: it hears pushes (with ``push``); the oldest beyond the bound go."""
        if not self.push:
            return
        if not self._watch(self._sessions, session):
            self._sessions.popitem(last=False)
            self._watch(self._sessions, session)

    def listed(self, session: Any) -> None:
        """A session listed the tools: it hears ``notifications/tools/list_changed`` (2025 era;
        a 2026-era client hears it on its ``subscriptions/listen`` stream). Bounded: the oldest go."""
        if not self._watch(self._listing, session):
            self._listing.popitem(last=False)
            self._watch(self._listing, session)

    def _on_skills(self) -> None:
        self._spawn(self._tools_changed())

    async def _tools_changed(self) -> None:
        from mcp.shared.subscriptions import ToolsListChanged

        for key, session in list(self._listing.items()):
            if await self._send(session, session.send_tool_list_changed()):
                self.sent["tools_changed"] += 1
            else:
                self._listing.pop(key, None)
        with contextlib.suppress(Exception):
            await self._bus.publish(ToolsListChanged())

    def subscribe(self, session: Any, uri: str) -> None:
        """``resources/subscribe``; raises :class:`meshd.errors.QueueFull` past the bound."""
        from meshd.errors import QueueFull

        if uri != INBOX_URI:
            raise NoSuchTool(f"resource {uri!r} has no updates to subscribe to; subscribe to {INBOX_URI}")
        if not self._watch(self._subscribed, session):
            raise QueueFull(f"{MAX_WATCHERS} sessions are subscribed to {INBOX_URI} already")

    def unsubscribe(self, session: Any) -> None:
        self._subscribed.pop(self._key(session)[0], None)

    def _on_inbox(self, event: str, item: dict[str, Any] | None) -> None:
        self._spawn(self._announce(event, item))

    def _spawn(self, coro: Awaitable[None]) -> None:
        if len(self._sending) >= MAX_WATCHERS:  # sessions that do not read: drop, count
            self.sent["dropped"] += 1
            if asyncio.iscoroutine(coro):
                coro.close()
            return
        task = asyncio.ensure_future(coro)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _announce(self, event: str, item: dict[str, Any] | None) -> None:
        from mcp.shared.subscriptions import ResourceUpdated

        for key, session in list(self._subscribed.items()):
            if await self._send(session, session.send_resource_updated(INBOX_URI)):
                self.sent["updated"] += 1
            else:
                self._subscribed.pop(key, None)
        with contextlib.suppress(Exception):
            await self._bus.publish(ResourceUpdated(uri=INBOX_URI))
        if event != "arrived" or item is None or not self.push:
            return
        params = channel_params(item)
        for key, session in list(self._sessions.items()):
            if await self._send(session, _notify(session, CHANNEL_METHOD, params)):
                self.sent["pushed"] += 1
            else:
                self._sessions.pop(key, None)

    async def _send(self, session: Any, send: Awaitable[None]) -> bool:
        try:
            await asyncio.wait_for(send, _SEND_TIMEOUT_S)
        except Exception:
            log.debug("a notification to an MCP session failed; it is forgotten", exc_info=True)
            self.sent["dropped"] += 1
            return False
        return True


async def _notify(session: Any, method: str, params: dict[str, Any]) -> None:
    """A notification the SDK has no type for, on the session's connection-wide channel."""
    conn = getattr(session, "_connection", None)
    outbound = getattr(conn, "outbound", None)
    if outbound is None:
        raise RuntimeError("the session has no connection-wide channel")
    await outbound.notify(method, params)


def channel_params(item: dict[str, Any]) -> dict[str, Any]:
    """``notifications/claude/channel`` params for one arrival: the text an LLM reads, and string
    attributes (identifier keys, as Claude Code wants them)."""
    what = "request (answer with reply_message)" if item.get("is_request") else item.get("kind", "message")
    content = (f"meshd: a {what} from {item.get('from')} on topic {item.get('topic')!r}, "
               f"id {item.get('id')}: {_text(item.get('payload'))[:2000]}")
    meta = {"id": str(item.get("id")), "sender": str(item.get("from")), "topic": str(item.get("topic")),
            "kind": str(item.get("kind")), "is_request": "true" if item.get("is_request") else "false"}
    return {"content": content, "meta": meta}


def build_server(bridge: MeshMcpBridge, name: str, *, progress_every: float = 5.0,
                 push: bool = False) -> tuple[Any, InboxAnnouncer]:
    """The SDK's low-level ``Server`` with handlers over ``bridge``, and its announcer."""
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
    from mcp.shared.exceptions import MCPError

    bus = InMemorySubscriptionBus()
    announcer = InboxAnnouncer(bridge, push=push, bus=bus)

    async def list_tools(ctx: Any, params: Any) -> Any:
        announcer.seen(ctx.session)
        announcer.listed(ctx.session)
        return types.ListToolsResult(tools=[types.Tool(name=t["name"], description=t["description"],
                                                       input_schema=t["inputSchema"])
                                            for t in await bridge.tool_list()])

    async def call_tool(ctx: Any, params: Any) -> Any:
        announcer.seen(ctx.session)
        relay = ProgressRelay(ctx.session.report_progress, progress_every)
        try:
            result = await relay.run(bridge.call(params.name, dict(params.arguments or {}),
                                                 on_progress=relay.note, headers=_trace_of(params)))
        except MeshError as exc:
            return types.CallToolResult(content=[types.TextContent(text=f"{exc.code}: {exc.message}")],
                                        is_error=True)
        return types.CallToolResult(content=[types.TextContent(text=_text(result))],
                                    structured_content={"result": result})

    async def list_resources(ctx: Any, params: Any) -> Any:
        announcer.seen(ctx.session)
        return types.ListResourcesResult(resources=[
            types.Resource(uri=uri, name=kind, description=text, mime_type="application/json")
            for uri, (kind, text) in RESOURCES.items()])

    async def list_templates(ctx: Any, params: Any) -> Any:
        return types.ListResourceTemplatesResult(resource_templates=[types.ResourceTemplate(
            uri_template="meshd://tasks/{task_id}", name="task",
            description="One task of this daemon (task_status): state, assignee, result, why it waits.",
            mime_type="application/json")])

    async def read_resource(ctx: Any, params: Any) -> Any:
        uri = str(params.uri)
        try:
            text = _text(await bridge.read_resource(uri))
        except NoSuchTool as exc:  # no such resource: the spec's "Resource not found"
            raise MCPError(code=RESOURCE_NOT_FOUND, message=exc.message) from None
        except MeshError as exc:
            text = _text({"error": exc.code, "message": exc.message})
        return types.ReadResourceResult(contents=[types.TextResourceContents(
            uri=uri, mime_type="application/json", text=text)])

    async def subscribe(ctx: Any, params: Any) -> Any:
        announcer.seen(ctx.session)
        try:
            announcer.subscribe(ctx.session, str(params.uri))
        except NoSuchTool as exc:
            raise MCPError(code=RESOURCE_NOT_FOUND, message=exc.message) from None
        except MeshError as exc:
            raise MCPError(code=types.INTERNAL_ERROR, message=f"{exc.code}: {exc.message}") from None
        return types.EmptyResult()

    async def unsubscribe(ctx: Any, params: Any) -> Any:
        announcer.unsubscribe(ctx.session)
        return types.EmptyResult()

    async def initialized(ctx: Any, params: Any) -> None:
        announcer.seen(ctx.session)

    class _MeshServer(Server):
        # The SDK derives capabilities from the handlers; the push channel is declared here, on
        # every transport (the Streamable HTTP manager calls this for each session).
        def create_initialization_options(self, notification_options: Any = None,
                                          experimental_capabilities: dict[str, dict[str, Any]] | None = None,
                                          extensions: dict[str, dict[str, Any]] | None = None) -> Any:
            from mcp.server.lowlevel import NotificationOptions

            experimental = dict(experimental_capabilities or {})
            if push:
                experimental[CHANNEL_CAPABILITY] = {}
            # The skills of the mesh come and go with its agents: tools/list_changed says so.
            options = notification_options or NotificationOptions(tools_changed=True)
            return super().create_initialization_options(options, experimental or None, extensions)

    server = _MeshServer(name, version="1", instructions=(
        "meshd: this server is an agent on a peer mesh. list_agents shows who is there and how "
        "loaded; request_agent asks one and waits; create_task / create_plan hand work to agents "
        "by capability; wait_message reads what arrives for you (or read meshd://inbox; it is "
        "announced with notifications/resources/updated), reply_message answers requests."),
        on_list_tools=list_tools, on_call_tool=call_tool, on_list_resources=list_resources,
        on_list_resource_templates=list_templates, on_read_resource=read_resource,
        on_subscribe_resource=subscribe,
        on_unsubscribe_resource=unsubscribe, on_subscriptions_listen=ListenHandler(bus))
    server.add_notification_handler("notifications/initialized", types.NotificationParams, initialized)
    return server, announcer
