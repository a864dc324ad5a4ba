"""The gateway's HTTP routes: the coms-net contract, meshd's own endpoints, SSE streams, the page.

Owns: the routes (the same list as meshd.gateway.openapi.ROUTES; :func:`served_routes` lets a
test compare them), request parsing (each body or query checked by its model from
meshd.gateway.models; the size limit), the bearer-token middleware, the mapping of typed errors
to HTTP statuses and JSON error bodies, the answer check of ``http_check_responses``
(:func:`check_response`), the one-line log of requests aiohttp's parser refuses
(:class:`ParserErrors`), and the SSE stream writer (``Last-Event-ID`` resumption, gap reports,
keep-alives, slow readers disconnected and counted).
Must not touch: the node's internals (it asks :class:`~meshd.gateway.dashboard.MeshInfo`), the
token files (meshd.gateway.auth), how an HTTP agent talks to the mesh (meshd.gateway.sessions).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from pydantic import BaseModel, ValidationError

from meshd.client.tracing import trace_headers
from meshd.errors import MeshError, NoSuchAgent
from meshd.gateway import models as M
from meshd.gateway.dashboard import page_html
from meshd.gateway.errors import BadRequest, TooManyStreams, http_status
from meshd.gateway.events import EventBuffer, sse_frame
from meshd.gateway.models import parse_body, parse_model
from meshd.gateway.openapi import openapi_spec, response_model
from meshd.wire import protocol as P
from meshd.wire.system_names import ROUTE_PREFIX, SYSTEM_PREFIX

if TYPE_CHECKING:
    from meshd.gateway.service import Gateway

__all__ = ["ParserErrors", "build_app", "check_response", "served_routes"]

log = logging.getLogger("meshd.gateway")

KEEPALIVE_S = 5.0
WRITE_TIMEOUT_S = 5.0
PUBLIC_PATHS = frozenset({"/", "/favicon.ico"})
# The page loads nothing from elsewhere and talks only to this gateway.
_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
        "img-src 'self' data:")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
B = TypeVar("B", bound=BaseModel)


def _error(status: int, code: str, message: str, retry_after: float | None = None,
           field: str | None = None) -> web.Response:
    err: dict[str, Any] = {"code": code, "message": message}
    if field:
        err["field"] = field
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
        self.checked_responses = 0  # http_check_responses: answers checked against their model
        self.invalid_responses = 0

    # ------------------------------------------------------------------ middleware

    @web.middleware
    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in PUBLIC_PATHS and not self.gw.guard.check(request.headers.get("Authorization")):
            return web.Response(status=401, headers={"WWW-Authenticate": 'Bearer realm="meshd"'})
        try:
            return await handler(request)
        except web.HTTPMethodNotAllowed as exc:  # the JSON error body, and Allow: the methods served
            resp = _error(405, "METHOD_NOT_ALLOWED", f"{request.method} is not served on {request.path}; "
                          f"allowed: {', '.join(sorted(exc.allowed_methods))}")
            resp.headers["Allow"] = ",".join(sorted(exc.allowed_methods))
            return resp
        except web.HTTPNotFound:
            return _error(404, "NOT_FOUND", f"no route {request.path!r} (GET /v1/openapi.json lists them)")
        except web.HTTPRequestEntityTooLarge:
            return _error(413, "TOO_LARGE", f"body larger than {self.gw.settings.http_max_body_bytes} bytes "
                          "(http_max_body_bytes)")
        except MeshError as exc:
            field = exc.details.get("field")
            return _error(http_status(exc.code), exc.code, exc.message, exc.retry_after,
                          field if isinstance(field, str) else None)
        except TimeoutError as exc:  # a wait the mesh did not turn into its own TIMEOUT
            return _error(504, "TIMEOUT", str(exc) or "timed out")
        except web.HTTPException:
            raise
        except Exception as exc:  # a bug: the traceback for the log, the JSON error body for the client
            log.exception("%s %s failed", request.method, request.path)
            return _error(500, "INTERNAL", f"the gateway failed ({type(exc).__name__}); see the daemon's log")

    @web.middleware
    async def check_responses(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """``http_check_responses`` (tests): every JSON answer must fit its model in the document."""
        resp = await handler(request)
        info = request.match_info.route.resource
        template = info.canonical if info is not None else request.path
        why = check_response(request.method, _template(template), resp)
        self.checked_responses += 1
        if why is None:
            return resp
        self.invalid_responses += 1
        log.error("answer to %s %s does not fit the OpenAPI document: %s", request.method, template, why)
        return _error(500, "RESPONSE_INVALID", f"the gateway's answer does not fit its model: {why}")

    # ------------------------------------------------------------------ parsing

    async def body(self, request: web.Request, model: type[B]) -> B:
        raw = await request.read()  # aiohttp refuses past client_max_size with 413
        return parse_body(model, raw)

    def check_target(self, target: str) -> None:
        """A plain name must be in the directory now: an unknown one is a 404 at once, as is a
        name no agent can have."""
        name, at, node = target.partition("@")
        if not P.valid_name(name) or (at and not (P.valid_name(node) or node.isalnum())):
            raise NoSuchAgent(f"no agent can be called {target!r} (an agent name: printable, no '@' or "
                              "spaces; then optionally '@' and a node)")
        if at or name.startswith((SYSTEM_PREFIX, ROUTE_PREFIX)):  # elsewhere, a system agent, or a
            # route: address (a plugin of the daemon chooses; NO_SUCH_AGENT if none does)
            return
        if not any(a.get("name") == target for a in self.gw.mesh.agents()):
            raise NoSuchAgent(f"no agent named {target!r} in the mesh")

    # ------------------------------------------------------------------ the coms-net contract

    async def register(self, request: web.Request) -> web.Response:
        req = await self.body(request, M.RegisterRequest)
        info = {"project": req.project, "model": req.model, "colour": req.colour}
        session = await self.gw.sessions.register(req.session_id or None, req.name, info,
                                                  list(req.capabilities),
                                                  [c.model_dump() for c in req.contracts])
        sse_path = f"/v1/agents/{session.session_id}/events"
        return web.json_response({
            "session_id": session.session_id, "name": req.name, "node": session.agent.node,
            "node_name": session.agent.node_name, "sse_url": self.gw.url + sse_path.lstrip("/"),
            "heartbeat_url": f"{self.gw.url}v1/agents/{session.session_id}/heartbeat",
            "heartbeat_interval_s": self.gw.settings.heartbeat_interval,
            "stale_after_s": self.gw.settings.stale_after, "offline_after_s": self.gw.settings.offline_after,
        })

    async def unregister(self, request: web.Request) -> web.Response:
        await self.gw.sessions.unregister(request.match_info["session_id"])
        return web.json_response({"ok": True})

    async def heartbeat(self, request: web.Request) -> web.Response:
        raw = await request.read()
        sid = request.match_info.get("session_id")
        req: M.HeartbeatRequest
        if sid is None:  # POST /v1/agents/heartbeat
            body = parse_body(M.SessionHeartbeatRequest, raw)
            sid, req = body.session_id, body
        else:
            req = parse_body(M.HeartbeatRequest, raw) if raw else M.HeartbeatRequest()
        session = self.gw.sessions.get(sid)
        telemetry: M.HeartbeatTelemetry = req.telemetry if req.telemetry is not None else req
        session.heartbeat(telemetry.model_dump(include=set(M.HeartbeatTelemetry.model_fields),
                                               exclude_unset=True))
        return web.json_response({"ok": True, "pending_requests": len(session.pending)})

    async def events(self, request: web.Request) -> web.StreamResponse:
        session = self.gw.sessions.get(request.match_info["session_id"])
        session.streams += 1
        try:
            return await self.stream(request, session.events)
        finally:
            session.streams -= 1

    async def message(self, request: web.Request) -> web.Response:
        req = await self.body(request, M.MessageRequest)
        session = self.gw.sessions.get(req.sender_session or req.session_id)
        self.check_target(req.target)
        if "payload" in req.model_fields_set:
            payload = req.payload
        else:
            payload = {"prompt": req.prompt, **({"tasks": req.tasks} if req.tasks is not None else {})}
        msg_id = session.start_message(req.target, req.topic, payload, expects_response=req.expects_response,
                                       timeout=req.timeout, qos=req.qos, priority=req.priority,
                                       headers=trace_headers(request.headers))
        return web.json_response({"msg_id": msg_id, "expects_response": req.expects_response}, status=202)

    async def respond(self, request: web.Request) -> web.Response:
        req = await self.body(request, M.RespondRequest)
        msg_id = request.match_info["msg_id"]
        owner = self.gw.sessions.owner_of(msg_id)
        if req.session_id and req.session_id != owner.session_id:
            raise BadRequest(f"request {msg_id!r} was not sent to session {req.session_id!r}",
                             details={"field": "session_id"})
        error = req.error or None
        payload = req.payload if "payload" in req.model_fields_set else {"response": req.response}
        await owner.respond(msg_id, payload, error)
        return web.json_response({"ok": True})

    async def delegate(self, request: web.Request) -> web.Response:
        req = await self.body(request, M.DelegateRequest)
        msg_id = request.match_info["msg_id"]
        owner = self.gw.sessions.owner_of(msg_id)
        await owner.delegate(msg_id, req.target, req.topic or None)
        return web.json_response({"ok": True})

    # ------------------------------------------------------------------ meshd's own endpoints

    async def agents(self, request: web.Request) -> web.Response:
        return web.json_response(self.gw.mesh.agents())

    async def contracts(self, request: web.Request) -> web.Response:
        name = request.match_info["agent"]
        for rec in self.gw.mesh.agents():
            if rec.get("name") == name:
                found = rec.get("contracts")
                return web.json_response({"name": name, "node": rec.get("node"),
                                          "node_name": rec.get("node_name"),
                                          "contracts": found if isinstance(found, list) else []})
        return _error(404, "NO_SUCH_AGENT", f"no agent {name!r} in the mesh directory")

    async def peers(self, request: web.Request) -> web.Response:
        return web.json_response(self.gw.mesh.peers())

    async def node(self, request: web.Request) -> web.Response:
        return web.json_response(self.gw.mesh.info() | {"gateway": self.gw.stats()}, dumps=_dumps)

    async def deadletters(self, request: web.Request) -> web.Response:
        return web.json_response(self.gw.mesh.dead_letters(), dumps=_dumps)

    async def request_reply(self, request: web.Request) -> web.Response:
        req = await self.body(request, M.RequestRequest)
        session = self.gw.sessions.get(req.session_id or req.sender_session)
        self.check_target(req.target)
        started = time.monotonic()
        # The caller's W3C trace context (HTTP headers) becomes the mesh message's: one trace.
        answer = await session.agent.request(req.target, req.topic, req.payload, timeout=req.timeout,
                                             priority=req.priority,
                                             headers=trace_headers(request.headers) or None)
        return web.json_response({"ok": True, "payload": answer,
                                  "latency_ms": round((time.monotonic() - started) * 1000, 3)})

    async def gather(self, request: web.Request) -> web.Response:
        req = await self.body(request, M.GatherRequest)
        session = self.gw.sessions.get(req.session_id or req.sender_session)
        started = time.monotonic()
        replies, summary = await session.agent.gather(
            req.topic, req.payload, to=req.to or None, capability=req.capability or None,
            subscribers_of=req.subscribers_of or None, want=req.want or None, timeout=req.timeout,
            priority=req.priority).collect()
        return web.json_response({"replies": [{"sender": r.sender, "payload": r.payload} for r in replies],
                                  "summary": summary.as_dict(),
                                  "latency_ms": round((time.monotonic() - started) * 1000, 3)}, dumps=_dumps)

    async def handoff(self, request: web.Request) -> web.Response:
        req = await self.body(request, M.HandoffRequest)
        session = self.gw.sessions.get(req.session_id or req.sender_session)
        self.check_target(req.target)
        verdict = await session.agent.handoff(req.target, req.task_id, req.context, req.artifacts,
                                              timeout=req.timeout, priority=req.priority)
        return web.json_response({"accepted": verdict.accepted, "reason": verdict.reason,
                                  "data": verdict.data})

    async def publish(self, request: web.Request) -> web.Response:
        req = await self.body(request, M.PublishRequest)
        session = self.gw.sessions.get(req.session_id or req.sender_session)
        reached = await session.agent.publish(req.topic, req.payload, qos=req.qos, reach=True,
                                              priority=req.priority,
                                              headers=trace_headers(request.headers) or None)
        return web.json_response({"subscribers": reached})

    async def subscribe(self, request: web.Request) -> web.Response:
        req = await self.body(request, M.SubscribeRequest)
        session = self.gw.sessions.get(req.session_id)
        if request.path.endswith("/unsubscribe"):
            await session.agent.unsubscribe(req.topic)
        else:
            await session.agent.subscribe(req.topic, durable=req.durable)
        return web.json_response({"ok": True, "topic": req.topic})

    # ------------------------------------------------------------------ syscall tools

    async def tools(self, request: web.Request) -> web.Response:
        """The daemon's tools, listed for (and as) the HTTP agent named by ``?session_id=``."""
        query = parse_model(M.ToolsQuery, dict(request.query))
        session = self.gw.sessions.get(query.session_id)
        return web.json_response({"tools": await session.agent.tools(format=query.format)}, dumps=_dumps)

    async def call_tool(self, request: web.Request) -> web.Response:
        """Call a tool as the HTTP agent: approvals, quotas and authorization apply to it."""
        req = await self.body(request, M.ToolCallRequest)
        session = self.gw.sessions.get(req.session_id)
        timeout = req.timeout or self.gw.settings.tools.approval_timeout + 5
        started = time.monotonic()
        result = await session.agent.call_tool(request.match_info["name"], req.args, timeout=timeout)
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
        if not re.fullmatch(r"[0-9]{1,18}", raw_last):
            raise BadRequest("Last-Event-ID must be a decimal event id", details={"field": "Last-Event-ID"})
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


def _template(canonical: str) -> str:
    """A route's path as the document writes it (the router's regex parts dropped)."""
    return re.sub(r"\{(\w+):[^}]*\}", r"{\1}", canonical)


def check_response(method: str, template: str, resp: web.StreamResponse) -> str | None:
    """Why ``resp`` does not fit the document's model for it (None when it fits, or is not JSON)."""
    if not isinstance(resp, web.Response):
        return None  # a stream: its content type is what the document says (checked by the tests)
    adapter = response_model(method, template, resp.status)
    if adapter is None:
        return None
    if resp.content_type != "application/json":
        return f"content type {resp.content_type!r}, not application/json"
    body = resp.body
    if not isinstance(body, bytes | bytearray):
        return "no JSON body"
    try:
        adapter.validate_json(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return f"{where or 'body'}: {first.get('msg')}"
    return None


def _gap_frame(first: int, last: int) -> bytes:
    data = json.dumps({"first": first, "last": last, "missed": last - first + 1})
    return f"event: gap\ndata: {data}\n\n".encode()


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=lambda o: o.hex() if isinstance(o, bytes) else str(o))


_SESSION = "{session_id:(?!register$|heartbeat$)[A-Za-z0-9_~-]{1,128}}"
"""The router's session id segment: the document's pattern, and never the fixed segments beside it
(so ``DELETE /v1/agents/register`` is a 405 that allows POST only, not a session named register)."""


def build_app(gateway: Gateway) -> tuple[web.Application, Routes]:
    """The aiohttp application with every route of meshd.gateway.openapi.ROUTES (a test checks
    the two agree); the body limit is http_max_body_bytes."""
    routes = Routes(gateway)
    middlewares = [routes.guard]
    if gateway.settings.http_check_responses:  # outermost: it sees the guard's error answers too
        middlewares.insert(0, routes.check_responses)
    app = web.Application(middlewares=middlewares, client_max_size=gateway.settings.http_max_body_bytes)
    r = app.router
    sid = _SESSION
    r.add_get("/", routes.page)
    r.add_get("/favicon.ico", routes.favicon)
    r.add_get("/v1/openapi.json", routes.openapi)
    r.add_post("/v1/agents/register", routes.register)
    r.add_get("/v1/agents", routes.agents)
    r.add_get("/v1/agents/{agent:[!-?A-~]{1,128}}/contracts", routes.contracts)
    r.add_get(f"/v1/agents/{sid}/events", routes.events)
    r.add_post(f"/v1/agents/{sid}/heartbeat", routes.heartbeat)
    r.add_post("/v1/agents/heartbeat", routes.heartbeat)
    r.add_delete(f"/v1/agents/{sid}", routes.unregister)
    r.add_post("/v1/messages", routes.message)
    r.add_post("/v1/messages/{msg_id}/response", routes.respond)
    r.add_post("/v1/messages/{msg_id}/delegate", routes.delegate)
    r.add_get("/v1/peers", routes.peers)
    r.add_get("/v1/node", routes.node)
    r.add_get("/v1/deadletters", routes.deadletters)
    r.add_post("/v1/request", routes.request_reply)
    r.add_post("/v1/handoff", routes.handoff)
    r.add_post("/v1/gather", routes.gather)
    r.add_post("/v1/publish", routes.publish)
    r.add_post("/v1/subscribe", routes.subscribe)
    r.add_post("/v1/unsubscribe", routes.subscribe)
    r.add_get("/v1/tools", routes.tools)
    r.add_post("/v1/tools/{name}", routes.call_tool)
    r.add_post("/v1/token/rotate", routes.rotate)
    r.add_get("/v1/dashboard/events", routes.dashboard_events)
    return app, routes


def served_routes(app: web.Application) -> set[tuple[str, str]]:
    """(method, path template) of every route but HEAD (aiohttp's, beside each GET), as the document
    writes them."""
    out = set()
    for route in app.router.routes():
        info = route.resource
        if info is None or route.method == "HEAD":
            continue
        out.add((route.method.lower(), _template(info.canonical)))
    return out


class ParserErrors(logging.Filter):
    """On the logger given to aiohttp's request handler: a request its parser refuses (a NUL byte
    in a header, a bad request line) is answered 400 by aiohttp; here it becomes one counted line,
    logged once per reason, instead of a traceback per request."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self._seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError) or record.levelno < logging.ERROR:
            return True
        self.count += 1
        reason = str(exc.message).split(":", 1)[0][:80]
        if reason in self._seen:
            return False
        self._seen.add(reason)
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.msg = "refused an HTTP request that does not parse (400): %s (logged once per reason)"
        record.args = (reason,)
        return True
