"""The gateway's HTTP routes: the coms-net contract, meshd's own endpoints, SSE streams, the page.

Owns: request parsing (JSON bodies, size limit, field checks), the bearer-token middleware, the
mapping of typed errors to HTTP statuses and JSON error bodies, and the SSE stream writer
(``Last-Event-ID`` resumption, gap reports, keep-alives, slow readers disconnected and counted).
Must not touch: the node's internals (it asks :class:`~meshd.gateway.dashboard.MeshInfo`), the
token files (meshd.gateway.auth), how an HTTP agent talks to the mesh (meshd.gateway.sessions).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from meshd.errors import MeshError, NoSuchAgent, ValidationFailed
from meshd.gateway.dashboard import page_html
from meshd.gateway.errors import BadRequest, TooManyStreams, http_status
from meshd.gateway.events import EventBuffer, sse_frame
from meshd.gateway.openapi import openapi_spec
from meshd.tools.registry import SCHEMA_FORMATS
from meshd.wire import protocol as P

if TYPE_CHECKING:
    from meshd.gateway.service import Gateway

__all__ = ["build_app"]

log = logging.getLogger("meshd.gateway")

KEEPALIVE_S = 5.0
WRITE_TIMEOUT_S = 5.0
MAX_TIMEOUT_S = 3600.0
PUBLIC_PATHS = frozenset({"/", "/favicon.ico"})
# The page loads nothing from elsewhere and talks only to this gateway.
_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
        "img-src 'self' data:")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, code: str, message: str, retry_after: float | None = None) -> web.Response:
    err: dict[str, Any] = {"code": code, "message": message}
    if retry_after is not None:
        err["retry_after"] = retry_after
    return web.json_response({"error": err}, status=status)


class Routes:
    """One instance per gateway; every handler reads the gateway's parts, never the node."""

    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.streams = 0
        self.slow_disconnects = 0
        self.closed_streams = 0
        self.dashboards = 0

    # ------------------------------------------------------------------ middleware

    @web.middleware
    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in PUBLIC_PATHS and not self.gw.guard.check(request.headers.get("Authorization")):
            return web.Response(status=401, headers={"WWW-Authenticate": 'Bearer realm="meshd"'})
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            return _error(413, "TOO_LARGE", f"body larger than {self.gw.settings.http_max_body_bytes} bytes "
                          "(http_max_body_bytes)")
        except MeshError as exc:
            return _error(http_status(exc.code), exc.code, exc.message, exc.retry_after)

    # ------------------------------------------------------------------ parsing

    async def body(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()  # aiohttp refuses past client_max_size with 413
        if not raw:
            raise BadRequest("empty body: send a JSON object")
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequest(f"malformed JSON: {exc}")
        if not isinstance(data, dict):
            raise BadRequest(f"the body must be a JSON object, not {type(data).__name__}")
        return data

    @staticmethod
    def text(data: dict[str, Any], key: str, *, required: bool = True, default: str | None = None,
             limit: int = 1024) -> str | None:
        value = data.get(key, default)
        if value is None:
            if required:
                raise BadRequest(f"{key!r} is required")
            return None
        if not isinstance(value, str) or not value or len(value) > limit:
            raise BadRequest(f"{key!r} must be a non-empty string of at most {limit} characters")
        return value

    @staticmethod
    def number(data: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not low < value <= high:
            raise BadRequest(f"{key!r} must be a number in ({low:g}, {high:g}]")
        return float(value)

    def session_of(self, data: dict[str, Any], *keys: str) -> Any:
        for key in keys:
            if key in data:
                return self.gw.sessions.get(data[key])
        raise BadRequest(f"{keys[0]!r} is required (the session_id from /v1/agents/register)")

    def check_target(self, target: str) -> None:
        """A plain name must be in the directory now: an unknown one is a 404 at once."""
        if "@" in target:
            return
        if not any(a.get("name") == target for a in self.gw.mesh.agents()):
            raise NoSuchAgent(f"no agent named {target!r} in the mesh")

    @staticmethod
    def topic(data: dict[str, Any], default: str) -> str:
        topic = data.get("topic", default)
        if not P.valid_topic(topic):
            raise BadRequest(f"'topic' must be 1-{P.MAX_TOPIC_LEN} printable characters")
        return str(topic)

    # ------------------------------------------------------------------ the coms-net contract

    async def register(self, request: web.Request) -> web.Response:
        data = await self.body(request)
        name = self.text(data, "name", limit=P.MAX_NAME_LEN)
        assert name is not None
        if not P.valid_name(name):
            raise ValidationFailed(f"invalid agent name {name!r}: printable characters, no '@' or spaces")
        caps = data.get("capabilities", [])
        if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps) or len(caps) > 64:
            raise BadRequest("'capabilities' must be a list of at most 64 strings")
        info = {}
        for key in ("project", "model", "colour"):
            info[key] = self.text(data, key, required=False, limit=256)
        session_id = self.text(data, "session_id", required=False, limit=128)
        session = await self.gw.sessions.register(session_id, name, info, caps)
        sse_path = f"/v1/agents/{session.session_id}/events"
        return web.json_response({
            "session_id": session.session_id, "name": name, "node": session.agent.node,
            "node_name": session.agent.node_name, "sse_url": self.gw.url + sse_path.lstrip("/"),
            "heartbeat_url": f"{self.gw.url}v1/agents/{session.session_id}/heartbeat",
            "heartbeat_interval_s": self.gw.settings.heartbeat_interval,
            "stale_after_s": self.gw.settings.stale_after, "offline_after_s": self.gw.settings.offline_after,
        })

    async def unregister(self, request: web.Request) -> web.Response:
        await self.gw.sessions.unregister(request.match_info["session_id"])
        return web.json_response({"ok": True})

    async def heartbeat(self, request: web.Request) -> web.Response:
        data = await self.body(request) if request.can_read_body else {}
        sid = request.match_info.get("session_id") or data.get("session_id")
        session = self.gw.sessions.get(sid)
        nested = data.get("telemetry")
        telemetry: dict[str, Any] = nested if isinstance(nested, dict) else data
        pct = telemetry.get("context_used_pct")
        if pct is not None and (isinstance(pct, bool) or not isinstance(pct, int | float)
                                or not 0 <= pct <= 100):
            raise BadRequest("'context_used_pct' must be a number from 0 to 100")
        depth = telemetry.get("queue_depth")
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
            raise BadRequest("'queue_depth' must be a non-negative integer")
        summary = telemetry.get("tasks_summary")
        if summary is not None and len(json.dumps(summary)) > 4096:
            raise BadRequest("'tasks_summary' must encode to at most 4096 bytes of JSON")
        session.heartbeat(telemetry)
        return web.json_response({"ok": True, "pending_requests": len(session.pending)})

    async def events(self, request: web.Request) -> web.StreamResponse:
        session = self.gw.sessions.get(request.match_info["session_id"])
        session.streams += 1
        try:
            return await self.stream(request, session.events)
        finally:
            session.streams -= 1

    async def message(self, request: web.Request) -> web.Response:
        data = await self.body(request)
        session = self.session_of(data, "sender_session", "session_id")
        target = self.text(data, "target", limit=P.MAX_NAME_LEN * 3)
        assert target is not None
        self.check_target(target)
        payload = self.payload(data)
        expects = data.get("expects_response", True)
        if not isinstance(expects, bool):
            raise BadRequest("'expects_response' must be true or false")
        qos = data.get("qos", 0)
        if qos not in (0, 1) or isinstance(qos, bool):
            raise BadRequest("'qos' must be 0 or 1")
        msg_id = session.start_message(target, self.topic(data, "prompt"), payload, expects_response=expects,
                                       timeout=self.number(data, "timeout", 30.0, 0, MAX_TIMEOUT_S), qos=qos)
        return web.json_response({"msg_id": msg_id, "expects_response": expects}, status=202)

    def payload(self, data: dict[str, Any]) -> Any:
        if "payload" in data:
            return data["payload"]
        prompt = self.text(data, "prompt", required=False, limit=self.gw.settings.max_payload_bytes)
        if prompt is None:
            raise BadRequest("one of 'prompt' or 'payload' is required")
        tasks = data.get("tasks")
        return {"prompt": prompt, **({"tasks": tasks} if tasks is not None else {})}

    async def respond(self, request: web.Request) -> web.Response:
        data = await self.body(request)
        msg_id = request.match_info["msg_id"]
        owner = self.gw.sessions.owner_of(msg_id)
        sid = data.get("session_id", owner.session_id)
        if sid != owner.session_id:
            raise BadRequest(f"request {msg_id!r} was not sent to session {sid!r}")
        error = self.text(data, "error", required=False, limit=4096)
        if error is None and "payload" not in data and "response" not in data:
            raise BadRequest("one of 'response', 'payload' or 'error' is required")
        payload = data["payload"] if "payload" in data else {"response": data.get("response")}
        await owner.respond(msg_id, payload, error)
        return web.json_response({"ok": True})

    async def delegate(self, request: web.Request) -> web.Response:
        data = await self.body(request)
        msg_id = request.match_info["msg_id"]
        owner = self.gw.sessions.owner_of(msg_id)
        target = self.text(data, "target", limit=P.MAX_NAME_LEN * 3)
        assert target is not None
        topic = self.topic(data, "x") if "topic" in data else None
        await owner.delegate(msg_id, target, topic)
        return web.json_response({"ok": True})

    # ------------------------------------------------------------------ meshd's own endpoints

    async def agents(self, request: web.Request) -> web.Response:
        return web.json_response(self.gw.mesh.agents())

    async def peers(self, request: web.Request) -> web.Response:
        return web.json_response(self.gw.mesh.peers())

    async def node(self, request: web.Request) -> web.Response:
        return web.json_response(self.gw.mesh.info() | {"gateway": self.gw.stats()}, dumps=_dumps)

    async def deadletters(self, request: web.Request) -> web.Response:
        return web.json_response(self.gw.mesh.dead_letters(), dumps=_dumps)

    async def request_reply(self, request: web.Request) -> web.Response:
        data = await self.body(request)
        session = self.session_of(data, "session_id", "sender_session")
        target = self.text(data, "target", limit=P.MAX_NAME_LEN * 3)
        assert target is not None
        payload = data.get("payload")
        timeout = self.number(data, "timeout", 30.0, 0, MAX_TIMEOUT_S)
        started = time.monotonic()
        answer = await session.agent.request(target, self.topic(data, "request"), payload, timeout=timeout)
        return web.json_response({"ok": True, "payload": answer,
                                  "latency_ms": round((time.monotonic() - started) * 1000, 3)})

    async def handoff(self, request: web.Request) -> web.Response:
        data = await self.body(request)
        session = self.session_of(data, "session_id", "sender_session")
        target = self.text(data, "target", limit=P.MAX_NAME_LEN * 3)
        task_id = self.text(data, "task_id", limit=256)
        assert target is not None and task_id is not None
        verdict = await session.agent.handoff(target, task_id, data.get("context"), data.get("artifacts"),
                                              timeout=self.number(data, "timeout", 30.0, 0, MAX_TIMEOUT_S))
        return web.json_response({"accepted": verdict.accepted, "reason": verdict.reason,
                                  "data": verdict.data})

    async def publish(self, request: web.Request) -> web.Response:
        data = await self.body(request)
        session = self.session_of(data, "session_id", "sender_session")
        qos = data.get("qos", 0)
        if qos not in (0, 1) or isinstance(qos, bool):
            raise BadRequest("'qos' must be 0 or 1")
        reached = await session.agent.publish(self.topic(data, ""), data.get("payload"), qos=qos, reach=True)
        return web.json_response({"subscribers": reached})

    async def subscribe(self, request: web.Request) -> web.Response:
        data = await self.body(request)
        session = self.session_of(data, "session_id")
        durable = data.get("durable", False)
        if not isinstance(durable, bool):
            raise BadRequest("'durable' must be true or false")
        topic = self.topic(data, "")
        if request.path.endswith("/unsubscribe"):
            await session.agent.unsubscribe(topic)
        else:
            await session.agent.subscribe(topic, durable=durable)
        return web.json_response({"ok": True, "topic": topic})

    # ------------------------------------------------------------------ syscall tools

    async def tools(self, request: web.Request) -> web.Response:
        """The daemon's tools, listed for (and as) the HTTP agent named by ``?session_id=``."""
        session = self.session_of(dict(request.query), "session_id")
        fmt = request.query.get("format")
        if fmt is not None and fmt not in SCHEMA_FORMATS:
            raise BadRequest(f"'format' must be one of {', '.join(SCHEMA_FORMATS)}")
        return web.json_response({"tools": await session.agent.tools(format=fmt)}, dumps=_dumps)

    async def call_tool(self, request: web.Request) -> web.Response:
        """Call a tool as the HTTP agent: approvals, quotas and authorization apply to it."""
        data = await self.body(request)
        session = self.session_of(data, "session_id")
        args = data.get("args", {})
        if not isinstance(args, dict):
            raise BadRequest("'args' must be a JSON object (the tool's arguments)")
        timeout = self.number(data, "timeout", self.gw.settings.tools.approval_timeout + 5, 0, MAX_TIMEOUT_S)
        started = time.monotonic()
        result = await session.agent.call_tool(request.match_info["name"], args, timeout=timeout)
        return web.json_response({"ok": True, "result": result,
                                  "latency_ms": round((time.monotonic() - started) * 1000, 3)},
                                 dumps=_dumps)

    async def rotate(self, request: web.Request) -> web.Response:
        self.gw.rotate_token()
        return web.json_response({"ok": True, "token_file": str(self.gw.token_path)})

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(openapi_spec(self.gw.url))

    async def dashboard_events(self, request: web.Request) -> web.StreamResponse:
        self.dashboards += 1
        self.gw.dashboard_opened()
        try:
            return await self.stream(request, self.gw.dashboard)
        finally:
            self.dashboards -= 1
            self.gw.dashboard_closed()

    async def page(self, request: web.Request) -> web.Response:
        return web.Response(body=page_html(), content_type="text/html",
                            headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer",
                                     "Content-Security-Policy": _CSP})

    async def favicon(self, request: web.Request) -> web.Response:
        return web.Response(status=204)

    # ------------------------------------------------------------------ SSE

    async def stream(self, request: web.Request, buffer: EventBuffer) -> web.StreamResponse:
        if self.streams >= self.gw.settings.http_max_streams:
            raise TooManyStreams(f"{self.streams} SSE streams are open (http_max_streams)")
        raw_last = request.headers.get("Last-Event-ID", "0").strip() or "0"
        if not raw_last.isdigit():
            raise BadRequest("Last-Event-ID must be a decimal event id")
        cursor = int(raw_last)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
        self.streams += 1
        try:
            await resp.prepare(request)
            events, gap = buffer.since(cursor)
            if gap is not None:
                await resp.write(_gap_frame(gap.first, gap.last))
            while True:
                for event in events:
                    await asyncio.wait_for(resp.write(sse_frame(event)), WRITE_TIMEOUT_S)
                    cursor = event.id
                if buffer.closed:
                    break
                if not await buffer.wait(cursor, KEEPALIVE_S):
                    await asyncio.wait_for(resp.write(b": keep-alive\n\n"), WRITE_TIMEOUT_S)
                events, gap = buffer.since(cursor)
                if gap is not None:  # the reader fell behind by a whole buffer: too slow
                    self.slow_disconnects += 1
                    log.warning("SSE reader too slow (missed %d events): disconnected", gap.missed)
                    break
        except TimeoutError:
            self.slow_disconnects += 1
            log.warning("SSE reader not reading for %.0f s: disconnected", WRITE_TIMEOUT_S)
        except (ConnectionError, asyncio.CancelledError):
            self.closed_streams += 1
        finally:
            self.streams -= 1
        with contextlib.suppress(ConnectionError, RuntimeError):
            await resp.write_eof()
        return resp


def _gap_frame(first: int, last: int) -> bytes:
    data = json.dumps({"first": first, "last": last, "missed": last - first + 1})
    return f"event: gap\ndata: {data}\n\n".encode()


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=lambda o: o.hex() if isinstance(o, bytes) else str(o))


def build_app(gateway: Gateway) -> tuple[web.Application, Routes]:
    """The aiohttp application with every route; the body limit is http_max_body_bytes."""
    routes = Routes(gateway)
    app = web.Application(middlewares=[routes.guard], client_max_size=gateway.settings.http_max_body_bytes)
    r = app.router
    r.add_get("/", routes.page)
    r.add_get("/favicon.ico", routes.favicon)
    r.add_get("/v1/openapi.json", routes.openapi)
    r.add_post("/v1/agents/register", routes.register)
    r.add_get("/v1/agents", routes.agents)
    r.add_get("/v1/agents/{session_id}/events", routes.events)
    r.add_post("/v1/agents/{session_id}/heartbeat", routes.heartbeat)
    r.add_post("/v1/agents/heartbeat", routes.heartbeat)
    r.add_delete("/v1/agents/{session_id}", routes.unregister)
    r.add_post("/v1/messages", routes.message)
    r.add_post("/v1/messages/{msg_id}/response", routes.respond)
    r.add_post("/v1/messages/{msg_id}/delegate", routes.delegate)
    r.add_get("/v1/peers", routes.peers)
    r.add_get("/v1/node", routes.node)
    r.add_get("/v1/deadletters", routes.deadletters)
    r.add_post("/v1/request", routes.request_reply)
    r.add_post("/v1/handoff", routes.handoff)
    r.add_post("/v1/publish", routes.publish)
    r.add_post("/v1/subscribe", routes.subscribe)
    r.add_post("/v1/unsubscribe", routes.subscribe)
    r.add_get("/v1/tools", routes.tools)
    r.add_post("/v1/tools/{name}", routes.call_tool)
    r.add_post("/v1/token/rotate", routes.rotate)
    r.add_get("/v1/dashboard/events", routes.dashboard_events)
    return app, routes

