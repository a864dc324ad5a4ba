"""The agent client: attach to the local meshd and talk to any agent in the mesh by name.

``Agent`` is asyncio; ``BlockingAgent`` wraps it for scripts. Both speak the local protocol in
docs/PROTOCOL.md over the daemon's ipc:// socket.

Sending is adaptively batched: messages to the same destination that pile up within one loop
iteration (or while the socket is busy) leave as one batch of at most ``batch_max``; an idle
agent's message leaves at once. Payloads are msgpack-encoded here and decoded by the receiving
client; daemons never look inside them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgpack
import zmq

from . import protocol as P
from .config import default_socket_path
from .errors import (
    DaemonUnreachable,
    MeshError,
    RequestTimeout,
    TooLarge,
    ValidationFailed,
    error_from_wire,
)
from .protocol import FrameError, Kind

log = logging.getLogger("meshd.client")

DEFAULT_REQUEST_TIMEOUT = 30.0
CONTROL_TIMEOUT = 5.0
SEND_QUEUE_LIMIT = 10_000
ANY_TOPIC = "*"

T = TypeVar("T")


class _Deferred:
    def __repr__(self) -> str:
        return "meshd.DEFER"


DEFER: Any = _Deferred()
"""Return this from a request handler to answer later with ``Agent.reply`` (or ``fail``)."""


@dataclass(slots=True)
class Message:
    """A message as a handler sees it.

    For a request, ``reply_to`` and ``correlation_id`` say where the answer goes: the original
    requester and its id, even when the request was delegated along the way.
    """

    id: str
    kind: str
    topic: str
    sender: str
    to: str | None
    payload: Any
    correlation_id: str | None = None
    deadline: float | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    reply_to: str = ""
    hops: int = 0
    qos: int = 0
    _agent: Agent | None = None
    _answered: bool = False
    _cancelled: asyncio.Event | None = None

    @property
    def cancelled(self) -> asyncio.Event:
        """Set when the requester cancels; the handler's task is cancelled too."""
        if self._cancelled is None:
            self._cancelled = asyncio.Event()
        return self._cancelled

    @property
    def is_request(self) -> bool:
        return self.kind == Kind.REQUEST

    @property
    def tasks(self) -> list[dict[str, Any]]:
        """The task list the sender attached (``headers={"tasks": [{"title", "status"}, ...]}``,
        coms-net style): well-formed items only, at most 100; [] when there is none."""
        items = self.headers.get("tasks")
        if not isinstance(items, list):
            return []
        return [{"title": i["title"], "status": i["status"]} for i in items[:100]
                if isinstance(i, dict) and isinstance(i.get("title"), str)
                and isinstance(i.get("status"), str)]

    @property
    def time_left(self) -> float | None:
        """Seconds until the requester gives up (None if it set no deadline)."""
        return None if self.deadline is None else self.deadline - time.time()

    async def progress(self, note: str = "working") -> None:
        """Tell the requester the handler is still working (its ``on_progress`` sees ``note``)."""
        if self._agent is not None and self.is_request:
            self._agent._progress(self, note)


Handler = Callable[[Message], Any]


def _default(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)
    if callable(dump):  # pydantic models travel as plain dicts
        return dump(mode="json")
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} as msgpack")


def encode_payload(payload: Any) -> bytes:
    """msgpack-encode a payload; pydantic models become dicts."""
    try:
        return msgpack.packb(payload, use_bin_type=True, default=_default)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValidationFailed(f"payload is not msgpack-encodable: {exc}") from None


def decode_payload(data: bytes) -> Any:
    if not data:
        return None
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


@dataclass(frozen=True)
class HandoffResult:
    """The receiver's verdict on a handoff."""

    accepted: bool
    reason: str | None = None
    data: Any = None


class Agent:
    """A named agent attached to the local daemon.

    ::

        async with Agent("planner") as me:
            @me.on("verify")
            async def verify(msg):
                return {"ok": True}
            reply = await me.request("researcher", "verify", {"claim": "x"}, timeout=5)
    """

    def __init__(
        self,
        name: str,
        *,
        socket: str | Path | None = None,
        capabilities: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        heartbeat_interval: float = 1.0,
        batch_max: int = 64,
        max_payload_bytes: int = P.DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        if not P.valid_name(name):
            raise ValidationFailed(f"invalid agent name {name!r}: 1-128 printable characters, no '@'")
        if not 1 <= batch_max <= P.MAX_BATCH:
            raise ValidationFailed(f"batch_max must be 1..{P.MAX_BATCH}")
        self.name = name
        self.socket_path = Path(socket) if socket else default_socket_path()
        self.capabilities = list(capabilities or [])
        self.metadata = dict(metadata or {})
        self.heartbeat_interval = heartbeat_interval
        self.batch_max = batch_max
        self.max_payload_bytes = max_payload_bytes
        self.node: str | None = None
        self.node_name: str | None = None
        self.telemetry: dict[str, Any] = {}
        self.errors_received = 0
        self.evicted: MeshError | None = None  # set when another node's earlier registration won
        self.on_error: Callable[[MeshError, str | None], None] | None = None
        self._handlers: dict[str, Handler] = {}
        self._topics: dict[str, bool] = {}  # topic -> durable
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._batch_members: dict[str, list[str]] = {}
        self._progress_cbs: dict[str, Callable[[str], Any]] = {}
        self._expiring: dict[str, float] = {}  # msg id -> monotonic deadline (swept, no timer each)
        self._running: dict[str, tuple[asyncio.Task[Any], Message]] = {}
        self._delegated: dict[str, tuple[str, str]] = {}  # corr -> (delegate, who asked us)
        self._unit_left: dict[str, int] = {}
        self._acks: list[str] = []
        self._ack_scheduled = False
        self._out: dict[tuple[str, str], list[tuple[dict[str, Any], bytes]]] = {}
        self._flush_scheduled = False
        self._drain_pending = False
        self._draining = False
        self._sendq: deque[list[bytes]] = deque()
        self._writable: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ctx: zmq.Context[Any] | None = None
        self._sock: zmq.Socket[Any] | None = None
        self._fd: int | None = None
        self._hb_task: asyncio.Task[None] | None = None
        self._closed = False
        self._reregistering = False

    # ----------------------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Agent:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Connect to the daemon and register this agent's name; raises NameTaken etc."""
        if not self.socket_path.exists():
            raise DaemonUnreachable(f"no meshd agent socket at {self.socket_path} (is meshd running?)")
        self._loop = asyncio.get_running_loop()
        self._writable = asyncio.Event()
        self._writable.set()
        self._ctx = zmq.Context.instance()
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 200)
        sock.setsockopt(zmq.SNDHWM, 10_000)
        sock.setsockopt(zmq.RCVHWM, 10_000)
        sock.connect(f"ipc://{self.socket_path}")
        self._sock = sock
        self._fd = sock.getsockopt(zmq.FD)
        self._loop.add_reader(self._fd, self._drain)
        await self._register()
        self._hb_task = asyncio.create_task(self._heartbeat_loop(), name=f"meshd-agent-hb-{self.name}")

    async def _register(self) -> None:
        body = {"name": self.name, "capabilities": self.capabilities, "metadata": self.metadata}
        info = await self._control({P.KIND: Kind.REGISTER}, body)
        if isinstance(info, dict):
            self.node = info.get("node")
            self.node_name = info.get("node_name")

    async def close(self) -> None:
        """Unregister (best effort) and release the socket. Idempotent."""
        if self._closed or self._sock is None:
            self._closed = True
            return
        if self._hb_task is not None:
            self._hb_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._hb_task
        self._flush()
        with contextlib.suppress(MeshError, TimeoutError):
            await self._control({P.KIND: Kind.UNREGISTER}, timeout=1.0)
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(DaemonUnreachable("agent closed"))
        self._pending.clear()
        if self._loop is not None and self._fd is not None:
            self._loop.remove_reader(self._fd)
        self._sock.close(200)

    # ----------------------------------------------------------------------------- handlers

    def on(self, topic: str = ANY_TOPIC) -> Callable[[Handler], Handler]:
        """Decorator: handle messages on ``topic`` ("*" = any topic without its own handler).

        A handler gets a ``Message``; for a request, its return value (or awaited result) is
        the reply, and an exception it raises goes back to the requester as HANDLER_ERROR.
        """

        def register(fn: Handler) -> Handler:
            self._handlers[topic] = fn
            return fn

        return register

    def set_telemetry(self, **values: Any) -> None:
        """Telemetry sent with every heartbeat (context_used_pct, queue_depth, tasks_summary...)."""
        self.telemetry.update(values)

    # ----------------------------------------------------------------------------- primitives

    async def send(self, to: str, topic: str, payload: Any = None, *, qos: int = 0,
                   headers: dict[str, Any] | None = None) -> str:
        """Send without waiting for an answer.

        qos 0 (default): at most once; failures arrive later through ``on_error``.
        qos 1: at least once; duplicates are dropped by id, so the handler normally runs once
        (see docs/DELIVERY.md for the crash windows). Returns when the local daemon has the
        message on disk; it retries until the receiver's handler has finished.
        Returns the message id, which a later ``on_error`` (e.g. UNDELIVERABLE) names.
        """
        if qos not in (0, 1):
            raise ValidationFailed("qos must be 0 or 1")
        msg_id = P.new_id()
        header: dict[str, Any] = {P.KIND: Kind.SEND, P.ID: msg_id, P.TOPIC: topic}
        if headers:
            header[P.HEADERS] = headers
        data = self._payload(payload)
        if qos == 0:
            self._enqueue(("to", to), header, data)
            await self._backpressure()
            return msg_id
        loop = self._require_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._pending[msg_id] = fut
        # No timer per message (qos-1 sends come in thousands): the heartbeat loop sweeps.
        self._expiring[msg_id] = time.monotonic() + CONTROL_TIMEOUT * 2
        try:
            self._enqueue(("to1", to), header, data)
            await fut
            return msg_id
        finally:
            self._pending.pop(msg_id, None)
            self._expiring.pop(msg_id, None)

    async def request(self, to: str, topic: str, payload: Any = None, *,
                      timeout: float = DEFAULT_REQUEST_TIMEOUT,
                      headers: dict[str, Any] | None = None,
                      on_progress: Callable[[str], Any] | None = None) -> Any:
        """Send a request and return the reply's payload; never waits longer than ``timeout``.

        ``on_progress(note)`` is called when the handler reports progress. Cancelling the
        awaiting task (or the timeout passing) tells the handler it may stop.
        """
        if not timeout or timeout <= 0:
            raise ValidationFailed("timeout must be a positive number of seconds")
        loop = self._require_loop()
        msg_id = P.new_id()
        header: dict[str, Any] = {P.KIND: Kind.REQUEST, P.ID: msg_id, P.TOPIC: topic,
                                  P.DEADLINE: P.now() + timeout}
        if headers:
            header[P.HEADERS] = headers
        data = self._payload(payload)
        return await self._await_reply(loop, msg_id, to, topic, timeout, on_progress,
                                       lambda: self._enqueue(("to", to), header, data))

    async def _await_reply(self, loop: asyncio.AbstractEventLoop, msg_id: str, to: str, topic: str,
                           timeout: float, on_progress: Callable[[str], Any] | None,
                           send: Callable[[], None]) -> Any:
        fut: asyncio.Future[Any] = loop.create_future()
        self._pending[msg_id] = fut
        if on_progress is not None:
            self._progress_cbs[msg_id] = on_progress
        timer = loop.call_later(timeout, self._expire, msg_id, to, topic, timeout)
        try:
            send()
            return await fut
        except (asyncio.CancelledError, RequestTimeout):
            self._send_cancel(to, msg_id)
            raise
        finally:
            timer.cancel()
            self._pending.pop(msg_id, None)
            self._progress_cbs.pop(msg_id, None)

    async def reply(self, msg: Message, payload: Any = None, *, status: str | None = None) -> None:
        """Answer a request later (its handler returned ``DEFER``); goes to the original requester."""
        if not msg.is_request:
            raise ValidationFailed("only requests can be replied to")
        self._reply(msg, payload, status=status)

    async def fail(self, msg: Message, error: BaseException | str, *, code: str = "HANDLER_ERROR") -> None:
        """Answer a request later with an error (HANDLER_ERROR unless ``code`` says otherwise)."""
        text = str(error) or type(error).__name__
        remote_type = type(error).__name__ if isinstance(error, BaseException) else None
        self._reply_error(msg, code, text, remote_type=remote_type)

    async def delegate(self, msg: Message, to: str, *, topic: str | None = None,
                       payload: Any = DEFER) -> None:
        """Forward a request to ``to``; its reply goes straight to the original requester.

        Keeps the original correlation id and requester, counts one more hop (the daemon stops it
        past the hop limit with HOP_LIMIT), and passes on only the time the requester has left.
        """
        if not msg.is_request:
            raise ValidationFailed("only requests can be delegated")
        if msg.deadline is not None and msg.deadline <= time.time():
            raise RequestTimeout("the request's deadline has passed; not delegating it")
        header: dict[str, Any] = {
            P.KIND: Kind.REQUEST, P.ID: P.new_id(), P.FROM: self.name, P.TO: to,
            P.TOPIC: topic or msg.topic, P.CORR: msg.correlation_id or msg.id,
            P.ORIGIN: msg.reply_to or msg.sender, P.HOPS: msg.hops + 1,
        }
        if msg.deadline is not None:
            header[P.DEADLINE] = msg.deadline
        if msg.headers:
            header[P.HEADERS] = msg.headers
        data = self._payload(msg.payload if payload is DEFER else payload)
        msg._answered = True  # the delegate answers; this handler's return value is ignored
        # Remember where it went, so a cancel from the requester follows it down the chain.
        self._delegated[header[P.CORR]] = (to, msg.sender)
        while len(self._delegated) > 10_000:
            self._delegated.pop(next(iter(self._delegated)))
        self._flush()
        self._push([P.SIGNATURE, P.pack(header), data])  # never batched: the daemon checks its hops

    async def handoff(self, to: str, task_id: str, context: Any = None, artifacts: Any = None, *,
                      timeout: float = DEFAULT_REQUEST_TIMEOUT) -> HandoffResult:
        """Hand a task to another agent (topic ``handoff-task``); returns its accept or reject."""
        reply = await self.request(to, P.HANDOFF_TOPIC,
                                   {"task_id": task_id, "context": context, "artifacts": artifacts},
                                   timeout=timeout)
        if isinstance(reply, dict):
            return HandoffResult(bool(reply.get("accepted", False)), reply.get("reason"), reply.get("data"))
        return HandoffResult(bool(reply))

    async def publish(self, topic: str, payload: Any = None, *, qos: int = 0,
                      headers: dict[str, Any] | None = None) -> int:
        """Publish on ``topic``; returns how many subscribers (in the whole mesh) it reached.

        With ``qos=1``, durable subscribers (``subscribe(topic, durable=True)``) get it at least
        once and handle it once, through the publisher daemon's outbox; it returns once those
        copies are on disk.
        """
        if not P.valid_topic(topic):
            raise ValidationFailed(f"invalid topic {topic!r}")
        if qos not in (0, 1):
            raise ValidationFailed("qos must be 0 or 1")
        loop = self._require_loop()
        msg_id = P.new_id()
        header: dict[str, Any] = {P.KIND: Kind.PUBLISH, P.ID: msg_id, P.TOPIC: topic}
        if headers:
            header[P.HEADERS] = headers
        data = self._payload(payload)
        fut: asyncio.Future[Any] = loop.create_future()
        self._pending[msg_id] = fut
        # No timer per publish (they are many and fast): the heartbeat loop expires stragglers.
        self._expiring[msg_id] = time.monotonic() + CONTROL_TIMEOUT
        try:
            self._enqueue(("topic1" if qos else "topic", topic), header, data)
            return int(await fut)
        finally:
            self._pending.pop(msg_id, None)
            self._expiring.pop(msg_id, None)

    async def subscribe(self, topic: str, *, durable: bool = False) -> None:
        """Receive publications on ``topic`` (idempotent).

        ``durable=True``: qos-1 publications on it reach this agent at least once, handled once,
        even across a partition or a restart of this agent's daemon.
        """
        if not P.valid_topic(topic):
            raise ValidationFailed(f"invalid topic {topic!r}")
        header: dict[str, Any] = {P.KIND: Kind.SUBSCRIBE, P.TOPIC: topic}
        if durable:
            header[P.QOS] = 1
        await self._control(header)
        self._topics[topic] = durable

    async def unsubscribe(self, topic: str) -> None:
        """Stop receiving ``topic`` (idempotent)."""
        await self._control({P.KIND: Kind.UNSUBSCRIBE, P.TOPIC: topic})
        self._topics.pop(topic, None)

    async def agents(self) -> list[dict[str, Any]]:
        """Every agent in the mesh as this daemon knows it."""
        result = await self._control({P.KIND: Kind.QUERY, P.WHAT: "agents"})
        return list(result or [])

    async def peers(self) -> list[dict[str, Any]]:
        """The daemons this daemon knows, with their state."""
        result = await self._control({P.KIND: Kind.QUERY, P.WHAT: "peers"})
        return list(result or [])

    async def admin(self, op: str, **args: Any) -> Any:
        """A daemon operation (``deadletters.list``, ``.show``, ``.replay``, ``.purge``), as meshctl uses."""
        return await self._control({P.KIND: Kind.ADMIN, P.OP: op}, args)

    async def node_info(self) -> dict[str, Any]:
        """The local daemon's identity, endpoints and counters."""
        result = await self._control({P.KIND: Kind.QUERY, P.WHAT: "node"})
        return dict(result or {})

    # ------------------------------------------------------------------ syscall tools (issue 9)

    async def tools(self, *, format: str | None = None) -> list[dict[str, Any]]:
        """The tools this daemon serves: name, description, input_schema, side_effects, plugin
        (or, with ``format`` = ``openai`` / ``anthropic`` / ``mcp``, the shape that API takes)."""
        from .tools.names import TOPIC_LIST

        result = await self._system_request(TOPIC_LIST, {"format": format} if format else None,
                                            CONTROL_TIMEOUT)
        return list(result or [])

    async def call_tool(self, name: str, args: dict[str, Any] | None = None, *,
                        timeout: float = DEFAULT_REQUEST_TIMEOUT) -> Any:
        """Call tool ``name`` with ``args`` on the local daemon and return its result. Failures are
        typed: NoSuchTool, ValidationFailed (names the field), Forbidden, QuotaExceeded,
        ApprovalDenied, NotWired, RequestTimeout (a held call not decided within ``timeout``)."""
        from .tools.names import TOPIC_CALL

        return await self._system_request(TOPIC_CALL, {"name": name, "args": args or {}}, timeout)

    async def _system_request(self, topic: str, payload: Any, timeout: float) -> Any:
        """A request to this daemon's system agent. Just after the daemon started, its system agent
        may not be registered yet: NO_SUCH_AGENT (nothing was delivered) is retried within
        ``timeout``."""
        from .errors import NoSuchAgent
        from .tools.names import system_agent_name

        end = time.monotonic() + timeout
        delay = 0.02
        while True:
            try:
                return await self.request(system_agent_name(str(self.node)), topic, payload,
                                          timeout=max(end - time.monotonic(), 0.001))
            except NoSuchAgent:
                if time.monotonic() + delay >= end:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    # ----------------------------------------------------------------------------- internals

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self.evicted is not None:
            raise self.evicted
        if self._loop is None or self._closed:
            raise DaemonUnreachable("agent is not connected")
        return self._loop

    def _payload(self, payload: Any) -> bytes:
        data = encode_payload(payload)
        if len(data) > self.max_payload_bytes:
            raise TooLarge(f"payload of {len(data)} bytes exceeds the limit of {self.max_payload_bytes}")
        return data

    def _expire(self, msg_id: str, to: str, topic: str, timeout: float) -> None:
        fut = self._pending.get(msg_id)
        if fut is not None and not fut.done():
            fut.set_exception(RequestTimeout(f"no reply from {to!r} on {topic!r} within {timeout:g} s"))

    def _expire_control(self, msg_id: str) -> None:
        fut = self._pending.get(msg_id)
        if fut is not None and not fut.done():
            fut.set_exception(DaemonUnreachable(f"meshd at {self.socket_path} did not answer"))

    async def _control(self, header: dict[str, Any], body: Any = None,
                       timeout: float = CONTROL_TIMEOUT) -> Any:
        """A daemon-addressed call: send at once (never batched), await the ok or error."""
        loop = self._require_loop()
        msg_id = P.new_id()
        header[P.ID] = msg_id
        fut: asyncio.Future[Any] = loop.create_future()
        self._pending[msg_id] = fut
        timer = loop.call_later(timeout, self._expire_control, msg_id)
        try:
            self._flush()
            self._push([P.SIGNATURE, P.pack(header), P.pack(body) if body is not None else b""])
            return await fut
        finally:
            timer.cancel()
            self._pending.pop(msg_id, None)

    def _enqueue(self, key: tuple[str, str], header: dict[str, Any], payload: bytes) -> None:
        loop = self._require_loop()
        queue = self._out.get(key)
        if queue is None:
            if not self._flush_scheduled and not self._sendq:
                # Idle: this message leaves now (no added latency). Whatever follows in this
                # loop turn queues behind it and leaves as a batch at the end of the turn.
                self._out[key] = [(header, payload)]
                self._flush_key(key)
                self._flush_scheduled = True
                loop.call_soon(self._flush)
                return
            queue = self._out[key] = []
        queue.append((header, payload))
        if len(queue) >= self.batch_max:
            self._flush_key(key)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        for key in list(self._out):
            self._flush_key(key)

    def _flush_key(self, key: tuple[str, str]) -> None:
        items = self._out.pop(key, None)
        if not items:
            return
        field_name, dest = key
        dest_key = P.TOPIC if field_name.startswith("topic") else P.TO
        qos = 1 if field_name.endswith("1") else 0
        for chunk in self._chunks(items):
            if len(chunk) == 1:
                header, payload = chunk[0]
                header[P.FROM] = self.name
                header[dest_key] = dest
                if qos:
                    header[P.QOS] = 1
                self._push([P.SIGNATURE, P.pack(header), payload])
                continue
            batch_id = P.new_id()
            batch_header: dict[str, Any] = {P.KIND: Kind.BATCH, P.ID: batch_id, P.FROM: self.name,
                                            dest_key: dest, P.COUNT: len(chunk)}
            if qos:
                batch_header[P.QOS] = 1
            awaited = [h[P.ID] for h, _ in chunk if qos or h[P.KIND] == Kind.PUBLISH]
            if awaited:  # resolved by the daemon's one answer for the whole batch
                self._batch_members[batch_id] = awaited
            self._push([P.SIGNATURE, P.pack(batch_header), P.pack_batch(chunk)])

    def _chunks(self, items: list[tuple[dict[str, Any], bytes]]) -> list[list[tuple[dict[str, Any], bytes]]]:
        """Split into batches of at most ``batch_max`` messages and about ``max_payload_bytes``."""
        if len(items) == 1:
            return [items]
        chunks: list[list[tuple[dict[str, Any], bytes]]] = []
        current: list[tuple[dict[str, Any], bytes]] = []
        size = 0
        budget = self.max_payload_bytes
        for item in items:
            n = len(item[1]) + 128
            if current and (len(current) >= self.batch_max or size + n > budget):
                chunks.append(current)
                current, size = [], 0
            current.append(item)
            size += n
        if current:
            chunks.append(current)
        return chunks

    def _push(self, frames: list[bytes]) -> None:
        if self._sendq:
            self._sendq.append(frames)
            return
        assert self._sock is not None
        try:
            self._sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            self._sendq.append(frames)
            if self._writable is not None:
                self._writable.clear()
        self._kick()

    def _pump(self) -> None:
        assert self._sock is not None
        while self._sendq:
            try:
                self._sock.send_multipart(self._sendq[0], zmq.NOBLOCK)
            except zmq.Again:
                return
            self._sendq.popleft()
        if self._writable is not None:
            self._writable.set()

    async def _backpressure(self) -> None:
        if len(self._sendq) > SEND_QUEUE_LIMIT // self.batch_max and self._writable is not None:
            await self._writable.wait()

    def _kick(self) -> None:
        # The zmq FD is edge-triggered and a send can consume the edge: look again before the
        # loop sleeps (once per loop turn; a drain in progress reads until EAGAIN anyway).
        if self._loop is not None and not self._closed and not self._drain_pending and not self._draining:
            self._drain_pending = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_pending = False
        sock = self._sock
        if sock is None or sock.closed:
            return
        if self._sendq:
            self._pump()
        self._draining = True
        try:
            for _ in range(512):
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    self._on_frames(frames)
                except Exception:
                    log.exception("agent %s: dropped a message that could not be handled", self.name)
            else:
                assert self._loop is not None
                self._drain_pending = True
                self._loop.call_soon(self._drain)
        finally:
            self._draining = False
        if self._sendq:
            self._pump()
            self._kick()

    def _on_frames(self, frames: list[bytes]) -> None:
        if len(frames) < 3:
            raise FrameError("too_few_frames", str(len(frames)))
        P.check_signature(frames[0])
        header = P.unpack_header(frames[1])
        kind = header[P.KIND]
        unit = str(header[P.ID]) if header.get(P.QOS) == 1 and header.get(P.ID) else None
        if kind == Kind.BATCH:
            sender = header.get(P.FROM)
            to = header.get(P.TO)
            topic = header.get(P.TOPIC)
            pairs = P.split_batch(frames)
            if unit is not None:
                self._unit_left[unit] = len(pairs)
            for inner, payload in pairs:
                inner.setdefault(P.FROM, sender)
                if to is not None:
                    inner.setdefault(P.TO, to)
                if topic is not None:
                    inner.setdefault(P.TOPIC, topic)
                self._on_message(inner, payload, unit)
            return
        if unit is not None:
            self._unit_left[unit] = 1
        self._on_message(header, frames[2], unit)

    def _on_message(self, header: dict[str, Any], payload: bytes, unit: str | None = None) -> None:
        kind = header[P.KIND]
        if kind in (Kind.SEND, Kind.REQUEST, Kind.PUBLISH):
            self._dispatch(header, payload, unit)
            return
        if unit is not None:
            self._unit_done(unit)
        if kind == Kind.OK:
            self._resolve(header.get(P.CORR), header, payload)
        elif kind == Kind.REPLY:
            fut = self._pending.get(str(header.get(P.CORR)))
            if fut is not None and not fut.done():
                fut.set_result(decode_payload(payload))
        elif kind == Kind.ERROR:
            self._on_error(header)
        elif kind == Kind.PROGRESS:
            cb = self._progress_cbs.get(str(header.get(P.CORR)))
            if cb is not None:
                try:
                    result = cb(str(header.get(P.NOTE, "working")))
                    if inspect.iscoroutine(result):
                        self._spawn(result)
                except Exception:
                    log.exception("agent %s: on_progress callback raised", self.name)
        elif kind == Kind.CANCEL:
            corr = str(header.get(P.CORR))
            running = self._running.get(corr)
            if running is not None and running[1].sender == header.get(P.FROM):
                task, msg = running
                msg.cancelled.set()
                task.cancel()
            delegated = self._delegated.get(corr)
            if delegated is not None and delegated[1] == header.get(P.FROM):
                del self._delegated[corr]
                self._send_cancel(delegated[0], corr)  # pass it on to whoever has the work now

    def _resolve(self, corr: Any, header: dict[str, Any], payload: bytes) -> None:
        members = self._batch_members.pop(str(corr), None)
        if members is not None:
            for member in members:
                self._resolve(member, header, payload)
            return
        fut = self._pending.get(str(corr))
        if fut is None or fut.done():
            return
        if P.COUNT in header:
            fut.set_result(header[P.COUNT])
        else:
            fut.set_result(decode_payload(payload) if payload else None)

    def _on_error(self, header: dict[str, Any]) -> None:
        err = error_from_wire(header.get(P.ERROR))
        corr = header.get(P.CORR)
        ids = header.get(P.IDS)
        if isinstance(ids, list):
            targets: list[Any] = ids  # one envelope for a refused batch: one id per message
        else:
            members = self._batch_members.pop(str(corr), None) if corr else None
            targets = members if members is not None else [corr]
        unmatched = []
        for target in targets:
            fut = self._pending.get(str(target))
            if fut is not None and not fut.done():
                fut.set_exception(err)
            else:
                unmatched.append(target)
        if err.code == P.ErrorCode.NAME_TAKEN and unmatched and not self._reregistering:
            # Evicted: the same name was registered elsewhere during a partition and that
            # registration was earlier. This agent no longer owns its name; calls now raise.
            self.evicted = err
            log.warning("agent %s: %s", self.name, err.message)
        if err.code == P.ErrorCode.NOT_REGISTERED:
            if not self._closed and not self._reregistering and self.evicted is None:
                # The daemon restarted and forgot us: register again and restore subscriptions.
                self._reregistering = True  # now, not when the task starts: one re-registration
                self._spawn(self._reregister())
            return
        if err.code == P.ErrorCode.CANCELLED:
            return  # the answer to our own cancel, after we stopped waiting: nothing to report
        for target in unmatched:
            self.errors_received += 1
            if self.on_error is not None:
                self.on_error(err, str(target) if target else None)
            elif self.errors_received < 10 or self.errors_received % 1000 == 0:
                log.warning("agent %s: %s (%s; %d errors so far)", self.name, err.message, err.code,
                            self.errors_received)

    async def _reregister(self) -> None:
        try:
            await self._register()
            for topic, durable in list(self._topics.items()):
                header: dict[str, Any] = {P.KIND: Kind.SUBSCRIBE, P.TOPIC: topic}
                if durable:
                    header[P.QOS] = 1
                await self._control(header)
            log.info("agent %s registered again after a daemon restart", self.name)
        except MeshError as exc:
            log.warning("agent %s could not register again: %s", self.name, exc)
        finally:
            self._reregistering = False

    def _dispatch(self, header: dict[str, Any], payload: bytes, unit: str | None = None) -> None:
        try:
            self._run_handler(header, payload, unit)
        except BaseException:
            if unit is not None:
                self._unit_done(unit)
            raise

    def _run_handler(self, header: dict[str, Any], payload: bytes, unit: str | None) -> None:
        topic = str(header.get(P.TOPIC, ""))
        handler = self._handlers.get(topic) or self._handlers.get(ANY_TOPIC)
        kind = header[P.KIND]
        msg_id = str(header.get(P.ID, ""))
        corr = header.get(P.CORR)
        sender = str(header.get(P.FROM, ""))
        hops = header.get(P.HOPS, 0)
        msg = Message(
            id=msg_id,
            kind=kind,
            topic=topic,
            sender=sender,
            to=header.get(P.TO),
            payload=None,
            correlation_id=(str(corr) if corr else msg_id) if kind == Kind.REQUEST else corr,
            deadline=header.get(P.DEADLINE),
            headers=header.get(P.HEADERS) or {},
            reply_to=str(header.get(P.ORIGIN) or sender),
            hops=hops if isinstance(hops, int) else 0,
            qos=1 if unit is not None else 0,
            _agent=self,
        )
        try:
            msg.payload = decode_payload(payload)
        except Exception as exc:
            if msg.is_request:
                self._reply_error(msg, P.ErrorCode.VALIDATION_FAILED, f"payload undecodable: {exc}")
            self._unit_done(unit)
            return
        if handler is None:
            if msg.is_request:
                self._reply_error(msg, P.ErrorCode.HANDLER_ERROR,
                                  f"agent {self.name!r} has no handler for topic {topic!r}")
            self._unit_done(unit)
            return
        if msg.is_request and msg.deadline is not None and msg.deadline < time.time():
            # The requester has given up already: do not start work nobody waits for.
            self._reply_error(msg, P.ErrorCode.TIMEOUT, "the deadline passed before the handler started")
            self._unit_done(unit)
            return
        try:
            result = handler(msg)
        except Exception as exc:
            self._handler_failed(msg, exc)
            self._unit_done(unit)
            return
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(self._finish(msg, result, unit))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            if msg.is_request and msg.correlation_id:
                key = msg.correlation_id
                self._running[key] = (task, msg)
                task.add_done_callback(functools.partial(self._forget_running, key))
            return
        if msg.is_request:
            self._answer(msg, result)
        self._unit_done(unit)

    async def _finish(self, msg: Message, result: Awaitable[Any], unit: str | None) -> None:
        try:
            value = await result
        except asyncio.CancelledError:
            if msg.cancelled.is_set():
                self._reply_error(msg, P.ErrorCode.CANCELLED, "cancelled by the requester")
                self._unit_done(unit)
                return
            raise
        except Exception as exc:
            self._handler_failed(msg, exc)
            self._unit_done(unit)
            return
        if msg.is_request:
            self._answer(msg, value)
        self._unit_done(unit)

    def _forget_running(self, key: str, _task: asyncio.Task[Any]) -> None:
        self._running.pop(key, None)

    def _answer(self, msg: Message, value: Any) -> None:
        if msg._answered or value is DEFER:
            return
        self._reply(msg, value)

    def _unit_done(self, unit: str | None) -> None:
        """One message of a qos-1 unit finished; when all have, ack the unit to the daemon."""
        if unit is None:
            return
        left = self._unit_left.get(unit, 1) - 1
        if left > 0:
            self._unit_left[unit] = left
            return
        self._unit_left.pop(unit, None)
        self._acks.append(unit)
        if not self._ack_scheduled and self._loop is not None:
            self._ack_scheduled = True
            self._loop.call_soon(self._flush_acks)

    def _flush_acks(self) -> None:
        self._ack_scheduled = False
        acks, self._acks = self._acks, []
        if acks and not self._closed:
            self._push([P.SIGNATURE, P.pack({P.KIND: Kind.ACK, P.IDS: acks}), b""])

    def _progress(self, msg: Message, note: str) -> None:
        header = {P.KIND: Kind.PROGRESS, P.ID: P.new_id(), P.CORR: msg.correlation_id or msg.id,
                  P.NOTE: note[:200]}
        self._enqueue(("to", msg.reply_to or msg.sender), header, b"")

    def _send_cancel(self, to: str, msg_id: str) -> None:
        if self._closed:
            return
        with contextlib.suppress(MeshError):
            self._enqueue(("to", to), {P.KIND: Kind.CANCEL, P.ID: P.new_id(), P.CORR: msg_id}, b"")

    def _handler_failed(self, msg: Message, exc: Exception) -> None:
        log.warning("agent %s: handler for %r raised %s: %s", self.name, msg.topic, type(exc).__name__, exc)
        if msg.is_request:
            self._reply_error(msg, P.ErrorCode.HANDLER_ERROR, str(exc) or type(exc).__name__,
                              remote_type=type(exc).__name__)

    def _reply(self, msg: Message, value: Any, status: str | None = None) -> None:
        if self._closed:
            return
        msg._answered = True
        if msg.topic == P.HANDOFF_TOPIC and status is None:
            # One verdict, used for the header (daemons and observers) and the payload alike:
            # True/False, or a dict whose "accepted" says it (a dict without it is a reject).
            accepted = bool(value.get("accepted", False)) if isinstance(value, dict) else bool(value)
            value = ({**value, "accepted": accepted} if isinstance(value, dict) else {"accepted": accepted})
            status = "accepted" if accepted else "rejected"
        try:
            data = self._payload(value)
        except MeshError as exc:
            self._reply_error(msg, exc.code, f"reply refused: {exc.message}")
            return
        header = {P.KIND: Kind.REPLY, P.ID: P.new_id(), P.CORR: msg.correlation_id or msg.id,
                  P.TOPIC: msg.topic}
        if status is not None:
            header[P.STATUS] = status
        self._enqueue(("to", msg.reply_to or msg.sender), header, data)

    def _reply_error(self, msg: Message, code: str, message: str, remote_type: str | None = None) -> None:
        if self._closed or not msg.sender or msg._answered:
            return
        msg._answered = True
        err: dict[str, Any] = {"code": code, "message": message, "retry": False}
        if remote_type:
            err["type"] = remote_type
        header = {P.KIND: Kind.ERROR, P.ID: P.new_id(), P.CORR: msg.correlation_id or msg.id, P.ERROR: err}
        self._enqueue(("to", msg.reply_to or msg.sender), header, b"")

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _heartbeat_loop(self) -> None:
        while not self._closed and self.evicted is None:
            await asyncio.sleep(self.heartbeat_interval)
            telemetry = {"queue_depth": len(self._tasks)} | self.telemetry
            now = time.monotonic()
            for msg_id, deadline in list(self._expiring.items()):
                if deadline < now:
                    self._expire_control(msg_id)
            self._push([P.SIGNATURE, P.pack({P.KIND: Kind.AGENT_HEARTBEAT}), P.pack(telemetry)])


class BlockingAgent:
    """``Agent`` for scripts without asyncio: runs the agent's loop in a background thread.

    Handlers registered with ``on`` run in that thread.
    """

    def __init__(self, name: str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"meshd-agent-{name}",
                                        daemon=True)
        self._thread.start()
        self.agent = Agent(name, **kwargs)
        try:
            self._call(self.agent.connect(), CONTROL_TIMEOUT * 2)
        except BaseException:
            self._stop_loop()
            raise

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            if fut.done():
                raise  # the agent's own RequestTimeout, with its message
            fut.cancel()
            raise RequestTimeout("call did not finish in time") from None

    def on(self, topic: str = ANY_TOPIC) -> Callable[[Handler], Handler]:
        return self.agent.on(topic)

    def send(self, to: str, topic: str, payload: Any = None, **kw: Any) -> str:
        return self._call(self.agent.send(to, topic, payload, **kw), CONTROL_TIMEOUT * 2 + 1)

    def request(self, to: str, topic: str, payload: Any = None, *,
                timeout: float = DEFAULT_REQUEST_TIMEOUT, **kw: Any) -> Any:
        return self._call(self.agent.request(to, topic, payload, timeout=timeout, **kw), timeout + 1)

    def publish(self, topic: str, payload: Any = None, **kw: Any) -> int:
        return self._call(self.agent.publish(topic, payload, **kw), CONTROL_TIMEOUT + 1)

    def subscribe(self, topic: str) -> None:
        self._call(self.agent.subscribe(topic), CONTROL_TIMEOUT + 1)

    def unsubscribe(self, topic: str) -> None:
        self._call(self.agent.unsubscribe(topic), CONTROL_TIMEOUT + 1)

    def agents(self) -> list[dict[str, Any]]:
        return self._call(self.agent.agents(), CONTROL_TIMEOUT + 1)

    def peers(self) -> list[dict[str, Any]]:
        return self._call(self.agent.peers(), CONTROL_TIMEOUT + 1)

    def close(self) -> None:
        try:
            self._call(self.agent.close(), CONTROL_TIMEOUT)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> BlockingAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["DEFER", "Agent", "BlockingAgent", "HandoffResult", "Message"]
