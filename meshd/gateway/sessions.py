"""HTTP agents: each registered HTTP session is a real mesh agent attached to this daemon.

Owns: :class:`HttpSession` (one agent: a ``meshd.Agent`` with ``auto_heartbeat=False`` whose
heartbeats come from its HTTP client, so missed HTTP heartbeats make it stale, then offline, as
for any agent; its event buffer, the requests it has not answered yet, the messages it sent that
await an answer) and :class:`SessionTable` (every session, bounded by ``http_max_sessions``).
Must not touch: HTTP parsing or status codes (meshd.gateway.app), the node's internals, routing:
the daemon routes an HTTP agent's traffic exactly as any other agent's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from meshd.client import DEFER, Agent, Message
from meshd.errors import InboxFull, MeshError
from meshd.gateway.errors import NoSuchRequest, NoSuchSession, TooManyInFlight, TooManySessions
from meshd.gateway.events import EventBuffer
from meshd.wire import protocol as P

__all__ = ["HttpSession", "SessionTable"]

log = logging.getLogger("meshd.gateway")

TELEMETRY_KEYS = ("context_used_pct", "queue_depth", "tasks_summary")


class HttpSession:
    """One HTTP agent: its mesh agent, its SSE buffer, its open requests and messages."""

    def __init__(self, table: SessionTable, session_id: str, name: str, info: dict[str, Any],
                 agent: Agent, buffer_size: int, cap: int) -> None:
        self.table = table
        self.session_id = session_id
        self.name = name
        self.info = info
        self.agent = agent
        self.events = EventBuffer(buffer_size)
        self.cap = cap
        self.pending: dict[str, Message] = {}  # requests to this agent, awaiting its response
        self.in_flight: dict[str, asyncio.Task[None]] = {}  # its messages awaiting an answer
        self.streams = 0
        self.last_heartbeat = time.monotonic()
        agent.on("*")(self.on_message)

    def describe(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "name": self.name, **self.info,
                "telemetry": dict(self.agent.telemetry), "streams": self.streams,
                "pending_requests": len(self.pending), "in_flight": len(self.in_flight)}

    # ------------------------------------------------------------------ mesh -> HTTP client

    async def on_message(self, msg: Message) -> Any:
        payload = msg.payload
        event: dict[str, Any] = {
            "msg_id": msg.id, "from": msg.sender, "topic": msg.topic, "payload": payload,
            "kind": msg.kind, "qos": msg.qos,
        }
        if isinstance(payload, dict):
            if isinstance(payload.get("prompt"), str):
                event["prompt"] = payload["prompt"]
            if "tasks" in payload:
                event["tasks"] = payload["tasks"]
        if msg.kind == P.Kind.PUBLISH:
            self.events.append("publication", event)
            return None
        if not msg.is_request:
            self.events.append("prompt", event | {"expects_response": False})
            return None
        if len(self.pending) >= self.cap:
            await self.agent.fail(msg, InboxFull(f"HTTP agent {self.name!r} has {self.cap} requests "
                                                 "awaiting its response"), code=P.ErrorCode.INBOX_FULL)
            return DEFER
        self.pending[msg.id] = msg
        self.table.request_owner[msg.id] = self
        left = msg.time_left
        self.events.append("prompt", event | {"expects_response": True,
                                              "deadline_in_s": None if left is None else round(left, 3)})
        return DEFER

    def expire_requests(self) -> None:
        """Forget requests whose requester has given up (their deadline passed)."""
        now = time.monotonic()  # Message.deadline is this host's monotonic time
        for msg_id, msg in list(self.pending.items()):
            if msg.deadline is not None and msg.deadline < now:
                self._forget(msg_id)

    def _forget(self, msg_id: str) -> Message | None:
        self.table.request_owner.pop(msg_id, None)
        return self.pending.pop(msg_id, None)

    async def respond(self, msg_id: str, payload: Any, error: str | None) -> None:
        """Answer request ``msg_id`` (from a ``prompt`` event) with ``payload`` or an error."""
        msg = self._forget(msg_id)
        if msg is None:
            raise NoSuchRequest(f"no request {msg_id!r} awaits a response from {self.name!r}")
        if error is not None:
            await self.agent.fail(msg, error)
        else:
            await self.agent.reply(msg, payload)

    async def delegate(self, msg_id: str, target: str, topic: str | None) -> None:
        """Forward request ``msg_id`` to ``target``; its reply goes straight to the requester.

        The hop count goes up by one (the daemon stops it past ``hop_limit`` with HOP_LIMIT) and
        only the requester's remaining time travels on.
        """
        msg = self._forget(msg_id)
        if msg is None:
            raise NoSuchRequest(f"no request {msg_id!r} awaits a response from {self.name!r}")
        await self.agent.delegate(msg, target, topic=topic)

    # ------------------------------------------------------------------ HTTP client -> mesh

    def heartbeat(self, telemetry: dict[str, Any]) -> None:
        self.agent.set_telemetry(**{k: telemetry[k] for k in TELEMETRY_KEYS if k in telemetry})
        self.last_heartbeat = time.monotonic()
        self.agent.heartbeat()

    def start_message(self, target: str, topic: str, payload: Any, *, expects_response: bool,
                      timeout: float, qos: int, priority: int = P.DEFAULT_PRIORITY,
                      headers: dict[str, Any] | None = None) -> str:
        """Send (or request) in the background; the answer arrives as a ``response`` event."""
        if len(self.in_flight) >= self.cap:
            raise TooManyInFlight(f"{self.name!r} has {self.cap} messages awaiting an answer")
        msg_id = P.new_id()
        task = asyncio.create_task(self._deliver(msg_id, target, topic, payload, expects_response,
                                                 timeout, qos, priority, headers or None),
                                   name=f"meshd-gw-msg-{msg_id}")
        self.in_flight[msg_id] = task
        task.add_done_callback(lambda _t: self.in_flight.pop(msg_id, None))
        return msg_id

    async def _deliver(self, msg_id: str, target: str, topic: str, payload: Any, expects_response: bool,
                       timeout: float, qos: int, priority: int = P.DEFAULT_PRIORITY,
                       headers: dict[str, Any] | None = None) -> None:
        started = time.monotonic()
        try:
            if expects_response:
                answer = await self.agent.request(target, topic, payload, timeout=timeout, priority=priority,
                                                  headers=headers)
            else:
                await self.agent.send(target, topic, payload, qos=qos, priority=priority, headers=headers)
                return
        except MeshError as exc:
            self.events.append("response", {"msg_id": msg_id, "from": target, "ok": False,
                                            "error": {"code": exc.code, "message": exc.message}})
            return
        event: dict[str, Any] = {"msg_id": msg_id, "from": target, "ok": True, "payload": answer,
                                 "latency_ms": round((time.monotonic() - started) * 1000, 3)}
        if isinstance(answer, dict) and isinstance(answer.get("response"), str):
            event["response"] = answer["response"]
        self.events.append("response", event)

    async def close(self) -> None:
        for task in list(self.in_flight.values()):
            task.cancel()
        for msg_id in list(self.pending):
            msg = self._forget(msg_id)
            if msg is not None:
                with contextlib.suppress(MeshError):
                    await self.agent.fail(msg, "the HTTP agent left", code=P.ErrorCode.UNDELIVERABLE)
        await self.agent.close()
        self.events.close()


class SessionTable:
    """Every HTTP agent of this gateway, by session id and by name (bounded)."""

    def __init__(self, socket: Path, *, max_sessions: int, buffer_size: int, cap: int,
                 max_payload_bytes: int) -> None:
        self.socket = socket
        self.max_sessions = max_sessions
        self.buffer_size = buffer_size
        self.cap = cap
        self.max_payload_bytes = max_payload_bytes
        self.by_id: dict[str, HttpSession] = {}
        self.request_owner: dict[str, HttpSession] = {}
        self._lock = asyncio.Lock()

    def get(self, session_id: Any) -> HttpSession:
        session = self.by_id.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise NoSuchSession(f"no HTTP agent with session_id {session_id!r} on this gateway")
        return session

    def by_name(self, name: str) -> HttpSession | None:
        return next((s for s in self.by_id.values() if s.name == name), None)

    async def register(self, session_id: str | None, name: str, info: dict[str, Any],
                       capabilities: list[str], contracts: list[dict[str, Any]] | None = None) -> HttpSession:
        """Attach a new mesh agent for ``name`` (or return the session already registered).
        ``contracts``: typed topics with JSON Schemas (docs/contracts.md): advertised with the
        registration, and what arrives on them is validated before it becomes an event."""
        async with self._lock:
            if session_id and session_id in self.by_id:
                session = self.by_id[session_id]
                if session.name == name:
                    session.info.update(info)
                    return session
                await self._drop(session)
            if len(self.by_id) >= self.max_sessions:
                raise TooManySessions(f"{self.max_sessions} HTTP agents are registered already "
                                      "(http_max_sessions)")
            import secrets  # at the first registration, not at start (its hmac maps OpenSSL's libcrypto)

            metadata = {"via": "http", **{k: v for k, v in info.items() if v is not None}}
            agent = Agent(name, socket=self.socket, capabilities=capabilities, metadata=metadata,
                          max_payload_bytes=self.max_payload_bytes, auto_heartbeat=False)
            session = HttpSession(self, session_id or secrets.token_urlsafe(12), name, info, agent,
                                  self.buffer_size, self.cap)
            for c in contracts or []:
                agent.on(c["topic"], accepts=c.get("accepts"), returns=c.get("returns"),
                         version=c.get("version") or "1.0", description=c.get("description") or "",
                         examples=list(c.get("examples") or []))(session.on_message)
            try:
                await agent.connect()  # raises NameTaken etc.
            except BaseException:
                await agent.close()  # nothing kept: its socket is released at once
                raise
            agent.heartbeat()
            self.by_id[session.session_id] = session
            log.info("HTTP agent %r registered (session %s)", name, session.session_id)
            return session

    async def unregister(self, session_id: str) -> None:
        async with self._lock:
            await self._drop(self.get(session_id))

    async def _drop(self, session: HttpSession) -> None:
        self.by_id.pop(session.session_id, None)
        await session.close()
        log.info("HTTP agent %r left (session %s)", session.name, session.session_id)

    def owner_of(self, msg_id: str) -> HttpSession:
        session = self.request_owner.get(msg_id)
        if session is None:
            raise NoSuchRequest(f"no request {msg_id!r} awaits a response on this gateway")
        return session

    async def sweep(self, abandoned_after: float) -> None:
        """Expire requests past their deadline; drop sessions abandoned for ``abandoned_after`` s
        (no heartbeat and no open stream: their agent left the directory long ago)."""
        now = time.monotonic()
        for session in list(self.by_id.values()):
            session.expire_requests()
            if session.streams == 0 and now - session.last_heartbeat > abandoned_after:
                async with self._lock:
                    if self.by_id.get(session.session_id) is session:
                        log.info("HTTP agent %r abandoned (no heartbeat for %.0f s): session closed",
                                 session.name, now - session.last_heartbeat)
                        await self._drop(session)

    async def close_all(self) -> None:
        async with self._lock:
            for session in list(self.by_id.values()):
                await self._drop(session)
