"""The A2A HTTP server of ``meshd a2a``: cards, catalog, JSON-RPC and HTTP+JSON, behind a token.

Owns the app: the routes of docs/a2a.md, "URLs" (the SDK's JSON-RPC and REST routes, with the
agent as the A2A tenant; the cards and the catalog, built live from the mesh directory), the
request handler (the SDK's, with the task store's bound checked before a task is made), and the
gate in front: the Host header (DNS-rebinding protection), then ``Authorization: Bearer`` for
every call but reading cards and the catalog (a card says how to authenticate, so it is public).
"""

from __future__ import annotations

import collections
import hmac
import json
import logging
import time
from collections.abc import AsyncGenerator
from typing import Any, Final

from a2a.server.context import ServerCallContext
from a2a.server.events import Event
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import create_jsonrpc_routes, create_rest_routes
from a2a.types import Message, SendMessageRequest, Task
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from meshd.bindings.a2a.cards import (
    CARD_PATH,
    CATALOG_PATH,
    HOST_CARD_PATH,
    JSONRPC_PATH,
    MAX_SKILLS,
    REST_PATH,
    CardMaker,
    exposed,
)
from meshd.bindings.a2a.executor import ExposePolicy, MeshExecutor
from meshd.bindings.a2a.store import BoundedTaskStore
from meshd.client import Agent
from meshd.errors import MeshError

__all__ = ["DIRECTORY_TTL", "A2aGate", "MeshRequestHandler", "ServedAgents", "build_app"]

log = logging.getLogger("meshd.a2a")

TASKS_AGENT_TEXT: Final = ("Hands a task to the least-loaded mesh agent with a capability: name it in "
                           "the message metadata 'capability' (and a 'title'); the task's result is the "
                           "reply.")
DIRECTORY_TTL: Final = 1.0  # seconds a directory listing serves cards before it is asked again
_PUBLIC_SUFFIXES: Final = ("/.well-known/agent-card.json", CATALOG_PATH)


class MeshRequestHandler(DefaultRequestHandler):
    """The SDK's request handler; a message that would start a task first makes room for it in
    the bounded store (or is refused with ``TASK_STORE_FULL`` before anything runs)."""

    def __init__(self, *, store: BoundedTaskStore, **kwargs: Any) -> None:
        super().__init__(task_store=store, **kwargs)
        self.store = store

    async def on_message_send(self, params: SendMessageRequest,
                              context: ServerCallContext) -> Message | Task:
        if not params.message.task_id:
            await self.store.make_room()
        result: Message | Task = await super().on_message_send(params, context)
        return result

    async def on_message_send_stream(self, params: SendMessageRequest,
                                     context: ServerCallContext) -> AsyncGenerator[Event, None]:
        if not params.message.task_id:
            await self.store.make_room()
        async for event in super().on_message_send_stream(params, context):
            yield event


class ServedAgents:
    """The mesh agents served over A2A, from the directory, asked at most once per :data:`DIRECTORY_TTL`."""

    def __init__(self, agent: Agent, policy: ExposePolicy) -> None:
        self.agent = agent
        self.policy = policy
        self._at = -DIRECTORY_TTL
        self._records: list[dict[str, Any]] = []

    async def served(self) -> list[dict[str, Any]]:
        if time.monotonic() - self._at >= DIRECTORY_TTL:
            everyone = await self.agent.agents()
            virtual = self.policy.tasks_agent
            records = [r for r in everyone if r.get("name") != virtual and
                       exposed(str(r.get("name")), self.policy.patterns, self.policy.own)]
            if virtual:  # the tasks agent: its skills are every capability in the mesh
                caps = sorted({str(c) for r in everyone for c in (r.get("capabilities") or [])})
                records.insert(0, {"name": virtual, "capabilities": caps[:MAX_SKILLS], "state": "online",
                                   "metadata": {"description": TASKS_AGENT_TEXT}})
            self._records = records
            self._at = time.monotonic()
        return self._records


def build_app(agent: Agent, policy: ExposePolicy, cards: CardMaker, store: BoundedTaskStore,
              directory: ServedAgents) -> Starlette:
    """The Starlette app of ``meshd a2a`` (without the gate: :class:`A2aGate` wraps it)."""
    # The handler's own card only answers its capability checks (streaming on, push off).
    handler_card = cards.card({"name": "meshd", "capabilities": [], "metadata": {
        "description": "meshd agents over A2A; each agent's card is in the catalog"}})
    executor = MeshExecutor(agent, policy)
    handler = MeshRequestHandler(agent_executor=executor, store=store, agent_card=handler_card)

    async def card(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            records = await directory.served()
        except MeshError as exc:
            return _unavailable(exc)
        for record in records:
            if record.get("name") == name:
                return JSONResponse(agent_card_to_dict(cards.card(record)))
        return JSONResponse({"error": "NO_SUCH_AGENT", "message": f"no agent {name!r} is served over "
                             f"A2A here; see {CATALOG_PATH}"}, status_code=404)

    async def host_card(request: Request) -> Response:
        name = policy.default_agent
        try:
            records = await directory.served() if name else []
        except MeshError as exc:
            return _unavailable(exc)
        for record in records:
            if record.get("name") == name:
                return JSONResponse(agent_card_to_dict(cards.card(record, tenant=False)))
        return JSONResponse({"error": "NO_SUCH_AGENT", "message": "this host serves many agents "
                             f"(a2a.default_agent is {'not set' if not name else 'not online'}); see "
                             f"{CATALOG_PATH}"}, status_code=404)

    async def catalog(request: Request) -> Response:
        try:
            return JSONResponse(cards.catalog(await directory.served()))
        except MeshError as exc:
            return _unavailable(exc)

    routes: list[BaseRoute] = [
        Route(CATALOG_PATH, catalog, methods=["GET"]),
        Route(CARD_PATH, card, methods=["GET"]),
        Route(HOST_CARD_PATH, host_card, methods=["GET"]),
        # The SDK's A2A 0.3 adapters too (by the A2A-Version header): 0.3 clients, which know no
        # tenants, reach a2a.default_agent.
        *create_jsonrpc_routes(handler, rpc_url=JSONRPC_PATH, enable_v0_3_compat=True),
        Mount(REST_PATH, routes=create_rest_routes(handler, enable_v0_3_compat=True)),
    ]
    app = Starlette(routes=routes)
    app.state.executor = executor  # its counters, for meshctl a2a stats
    app.state.handler = handler  # drained at shutdown (run.py), while the agent is still attached
    return app


def _unavailable(exc: MeshError) -> Response:
    """The directory could not be read (the daemon restarts): 503, with the code, not a 500."""
    return JSONResponse({"error": exc.code, "message": exc.message}, status_code=503,
                        headers={"Retry-After": "1"})


class A2aGate:
    """ASGI middleware: a foreign Host gets 421; without the bearer token, anything but reading
    a card or the catalog gets 401 (with ``WWW-Authenticate``); a body over ``max_body`` bytes
    gets 413 before the SDK reads any of it (a chunked one is held, at most ``max_body``, and
    replayed). Counts refusals."""

    def __init__(self, app: Any, token: str | None, hosts: list[str],
                 max_body: int = 2 * 1024 * 1024) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode() if token is not None else None
        self._hosts = frozenset(h.encode() for h in hosts)
        self.max_body = max_body
        self.refused: collections.Counter[str] = collections.Counter()  # by code: MISDIRECTED, ...

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        path = str(scope.get("path", ""))
        public = scope.get("method") in ("GET", "HEAD") and path.endswith(_PUBLIC_SUFFIXES)
        if headers.get(b"host") not in self._hosts:
            await self._refuse(send, 421, "MISDIRECTED", "this Host is not served here (DNS-rebinding "
                               "protection); use the URL in meshd a2a's URL file")
        elif not public and self._expected is not None and \
                not hmac.compare_digest(headers.get(b"authorization", b""), self._expected):
            await self._refuse(send, 401, "UNAUTHORIZED", "a bearer token is required (the token file "
                               "named in meshd a2a's URL file); the Agent Card says so")
        else:
            await self._bounded(scope, receive, send, headers)

    async def _bounded(self, scope: dict[str, Any], receive: Any, send: Any,
                       headers: dict[bytes, bytes]) -> None:
        too_big = ("TOO_LARGE", f"the request body is over {self.max_body} bytes (a2a.max_body_bytes)")
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit() or int(length) > self.max_body:
                await self._refuse(send, 413, *too_big)
                return
            await self.app(scope, receive, send)
            return
        if scope.get("method") in ("GET", "HEAD", "DELETE"):
            await self.app(scope, receive, send)
            return
        held: list[dict[str, Any]] = []
        size = 0
        while True:  # chunked: held (bounded), then replayed
            message = await receive()
            held.append(message)
            size += len(message.get("body", b""))
            if size > self.max_body:
                await self._refuse(send, 413, *too_big)
                return
            if message.get("type") != "http.request" or not message.get("more_body"):
                break

        async def replay() -> Any:
            return held.pop(0) if held else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Any, status: int, code: str, message: str) -> None:
        self.refused[code] += 1
        body = json.dumps({"error": code, "message": message}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="meshd-a2a"'))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
