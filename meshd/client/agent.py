"""The agent client's public API: attach to the local meshd and talk to any agent by name.

``Agent`` is asyncio; ``BlockingAgent`` (meshd/client/blocking.py) wraps it for scripts. Both speak the
local protocol in docs/PROTOCOL.md over the daemon's ipc:// socket. This module owns the public
methods, the calls waiting for the daemon or a reply (futures by message id, their time-outs),
registration and heartbeats. The layers under it, like nats.py's parser apart from its client:

* :mod:`meshd.client.batching` coalesces outgoing messages per typed :data:`~meshd.client.batching.BatchKey`
  (an idle agent's message leaves at once; what piles up leaves as batches of at most
  ``batch_max``) and splits incoming frame sets into messages;
* :mod:`meshd.client.handlers` runs handlers (cancel, deadlines, replies, qos-1 acks);
* :mod:`meshd.transport` drives the socket: the same ``Reactor`` as the daemon for reading, and
  a ``SendQueue`` that never blocks the loop for writing;
* :mod:`meshd.wire.payloads` encodes payloads (msgpack); daemons never decode them.

Parts the ``Agent`` owns: :mod:`meshd.client.incoming` (frame sets from the daemon: answers,
errors, work), :mod:`meshd.client.session` (registering, registering again, the heartbeat loop),
:mod:`meshd.client.resend` (qos-0 sends held across a daemon restart, re-registration),
:mod:`meshd.client.publish_window` (publishes awaiting confirmation), :mod:`meshd.client.send_pause`
(qos-0 sends paused by a full inbox), :mod:`meshd.client.call_slots` (calls awaiting answers, within
``in_flight_max``), :mod:`meshd.client.handler_slots` (handlers running, within
``max_concurrent_handlers``); :mod:`meshd.client.system_calls` makes the calls to the system agent.
``Agent.__init__`` is their composition root: it builds them in dependency order and gives each,
at construction, the parts it calls, the tables it shares with the ``Agent`` (the same dicts) and
callbacks (``incoming.AgentEvents`` for what the incoming side asks of the ``Agent``); no part
reads another's private attributes, and none is rewired after construction.

The embedded node is known only through :class:`EmbeddedLink` and :class:`InProcessLink`, Protocols
defined here: the client imports no daemon part, not even for typing.

Must not touch: daemon internals; nothing here parses frames or builds batches by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

import zmq

from meshd.client import tracing
from meshd.client.batching import Batcher, BatchKey
from meshd.client.call_slots import CallSlots
from meshd.client.contracts import Contract, ContractRefused, TypedTopic, is_model_class, to_wire
from meshd.client.gather import Gather
from meshd.client.handler_slots import DEFAULT_MAX_CONCURRENT_HANDLERS, HandlerSlots
from meshd.client.handlers import ANY_TOPIC, DEFER, Dispatcher, Handler, Message
from meshd.client.incoming import ERROR_LOG_EVERY as ERROR_LOG_EVERY
from meshd.client.incoming import AgentEvents, Incoming
from meshd.client.publish_window import PUBLISH_WINDOW as PUBLISH_WINDOW
from meshd.client.publish_window import PublishWindow
from meshd.client.resend import REREGISTER_ATTEMPTS as REREGISTER_ATTEMPTS
from meshd.client.resend import RESEND_WINDOW as RESEND_WINDOW
from meshd.client.resend import ResendHold
from meshd.client.send_pause import SendPauses
from meshd.client.send_queue import PrioritySendQueue
from meshd.client.session import Session, heartbeat_loop
from meshd.client.system_calls import system_request
from meshd.errors import (
    DaemonUnreachable,
    HandlerError,
    MeshError,
    NotRegistered,
    RequestTimeout,
    SchemaVersionUnsupported,
    ValidationFailed,
)
from meshd.transport import Reactor, agent_dealer
from meshd.util.paths import find_agent_socket
from meshd.wire import protocol as P
from meshd.wire import topics as T
from meshd.wire.contracts import SCHEMA_VERSION, check_records, format_version, parse_version, schema_errors
from meshd.wire.payloads import payload_encoder
from meshd.wire.protocol import Kind

log = logging.getLogger("meshd.client")

DEFAULT_REQUEST_TIMEOUT = 30.0
CONTROL_TIMEOUT = 5.0
SEND_QUEUE_LIMIT = 10_000
QOS1_RESENDS = 3
"""Times a qos-1 send goes again after NOT_REGISTERED (its daemon restarted and stored nothing),
each after the agent has registered again; a daemon restarting more often than that raises."""

_PLAIN = frozenset({dict, list, tuple, str, int, float, bool, bytes, type(None)})
"""Payload types sent as they are; anything else may be a model instance (``to_wire``)."""

FrameHandler = Callable[[list[bytes]], None]
"""Takes one frame set from the daemon (``Incoming.on_frames``)."""


class FrameSink(Protocol):
    """Where the agent's frame sets go: what the ``SendQueue`` (meshd/transport.py) drives and the
    agent closes. A DEALER is one; so is the agent's side of an in-process connection."""

    def send_multipart(self, frames: list[bytes], /, flags: int = 0) -> object: ...

    def close(self, linger: int | None = None) -> None: ...


@runtime_checkable
class InProcessLink(FrameSink, Protocol):
    """The agent's side of an in-process connection to an embedded node (the ``InProcessConnection``
    of meshd/daemon/embedded.py): a :class:`FrameSink` the agent tells when it is ready for the
    node's frame sets (``connected``) and when to stop and resume handing them over (its handler
    slots are all taken, meshd/client/handler_slots.py)."""

    connected: bool

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class EmbeddedLink(Protocol):
    """A node in this process that an agent attaches to without a socket (``Agent(embedded=...)``;
    meshd/daemon/embedded.py's ``EmbeddedNode`` is one). The client never imports it, not even for
    typing: this is all it needs of it."""

    @property
    def socket_path(self) -> Path:
        """Its ipc agent socket (what ``Agent.socket_path`` says)."""
        ...

    def attach(self, on_frames: FrameHandler) -> FrameSink:
        """A new in-process connection: the node's frame sets for the agent go to ``on_frames``.
        It returns an :class:`InProcessLink`; typed as the :class:`FrameSink` it also is, which a
        node's ``attach`` annotated as returning a zmq socket (it stands where the DEALER stood)
        satisfies too. ``Agent.connect`` checks the rest."""
        ...


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
        auto_heartbeat: bool = True,
        embedded: EmbeddedLink | None = None,
        max_concurrent_handlers: int = DEFAULT_MAX_CONCURRENT_HANDLERS,
        debug: bool = False,
        read_ahead: int = 0,
    ) -> None:
        """``debug=True``: a handler that raises sends its traceback with the HANDLER_ERROR
        (``err.details["trace"]`` at the requester); by default no stack trace leaves the agent."""
        if not P.valid_name(name):
            raise ValidationFailed(f"invalid agent name {name!r}: 1-128 printable characters, no '@'")
        if not 1 <= batch_max <= P.MAX_BATCH:
            raise ValidationFailed(f"batch_max must be 1..{P.MAX_BATCH}")
        self.name = name
        #: The in-process node this agent attaches to, without a socket (meshd/daemon/embedded.py).
        self.embedded = embedded
        self.socket_path = (embedded.socket_path if embedded is not None else
                            Path(socket) if socket else find_agent_socket())
        self.capabilities = list(capabilities or [])
        self.metadata = dict(metadata or {})
        self.heartbeat_interval = heartbeat_interval
        #: Beat every ``heartbeat_interval`` (False: only when :meth:`heartbeat` is called, e.g. by
        #: a gateway relaying its client's beats, so a silent client goes stale).
        self.auto_heartbeat = auto_heartbeat
        self.batch_max = batch_max
        self.max_payload_bytes = max_payload_bytes
        self.node: str | None = None
        self.node_name: str | None = None
        self.telemetry: dict[str, Any] = {}
        self.errors_received = 0
        self.evicted: MeshError | None = None  # set when another node's earlier registration won
        #: State-changing errors (NAME_TAKEN, NOT_REGISTERED) ignored because not from our daemon.
        self.forged_errors = 0
        self.on_error: Callable[[MeshError, str | None], None] | None = None
        # The composition root: the parts in dependency order, each given at construction what it
        # works on (the tables it shares are these very dicts, so no part reads another's state).
        self._topics: dict[str, bool] = {}  # topic -> durable
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._batch_members: dict[str, list[str]] = {}
        self._progress_cbs: dict[str, Callable[[str], Any]] = {}
        self._expiring: dict[str, float] = {}  # msg id -> monotonic deadline (swept, no timer each)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sock: zmq.Socket[Any] | None = None
        self._link: InProcessLink | None = None  # the same object as _sock, when embedded
        self._reactor: Reactor | None = None
        self._sendq: PrioritySendQueue | None = None
        self._hb_task: asyncio.Task[None] | None = None
        self._closed = False
        self._advertising = False  # a registration with new contracts is scheduled
        self._window = PublishWindow(CONTROL_TIMEOUT)  # publishes nobody awaits (publish_window.py)
        #: qos-0 sends to a destination whose inbox said INBOX_FULL wait a moment (meshd/client/send_pause.py)
        self.send_pauses = SendPauses()
        self._encode = payload_encoder()  # one reused msgpack Packer (meshd/wire/payloads.py)
        self._batcher = Batcher(name, batch_max=batch_max, max_payload_bytes=max_payload_bytes,
                                push=self._push, push_data=self._push_data, schedule=self._call_soon,
                                busy=self._busy,
                                on_batch=self._batch_members.__setitem__)
        # qos-0 sends a restarted daemon refused, sent again once registered (meshd/client/resend.py)
        self._resend = ResendHold(name, enqueue=self._enqueue, report=self._report_held)
        # Handlers running, then calls awaiting answers, then the handlers themselves: the slots
        # and the dispatcher call each other, so the slots reach the two built after them through
        # _dispatch_parked and the awaiting closure (called only while every slot is taken), and
        # the calls and the dispatcher get the slots' bound methods.
        if not 0 <= read_ahead <= MAX_READ_AHEAD:
            raise ValidationFailed(f"read_ahead must be 0..{MAX_READ_AHEAD}")
        self._handler_slots = HandlerSlots(
            name, max_concurrent_handlers, dispatch=self._dispatch_parked, push=self._push,
            enqueue=self._enqueue, reading=self._reading,
            awaiting=lambda: bool(self._calls.used) or bool(self._window.unconfirmed),
            read_ahead=read_ahead)
        self._calls = CallSlots(self.socket_path, on_busy_change=self._handler_slots.check_reading)
        self._dispatch = Dispatcher(name, enqueue=self._enqueue, push=self._push, encode=self._payload,
                                    schedule=self._call_soon, closed=lambda: self._closed,
                                    on_handler_task=self._handler_slots.handler_started, debug=debug)
        self._session = Session(control=self._control, hello=self._hello, registered=self._registered,
                                window=self._window, slots=self._handler_slots, calls=self._calls,
                                topics=self._topics)  # meshd/client/session.py
        # frame sets from the daemon (meshd/client/incoming.py)
        self._incoming = Incoming(
            name, dispatcher=self._dispatch, slots=self._handler_slots, pending=self._pending,
            progress=self._progress_cbs, batch_members=self._batch_members, window=self._window,
            send_pauses=self.send_pauses, resend=self._resend,
            events=AgentEvents(loop=lambda: self._loop, closed=lambda: self._closed,
                               node=lambda: self.node, evicted=lambda: self.evicted,
                               evict=self._evict, forged=self._count_forged, report=self._report,
                               reregister=self._session.reregister))
        self._incoming.grant = self._grant
        self._session.credit = self._incoming.credit_opened

    # ----------------------------------------------------------------------------- lifecycle

    @property
    def _unconfirmed(self) -> set[str]:
        """Ids of publishes nobody awaits, not confirmed yet (the :class:`PublishWindow`'s)."""
        return self._window.unconfirmed

    async def __aenter__(self) -> Agent:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Connect to the daemon and register this agent's name; raises NameTaken etc."""
        if self.embedded is None and not self.socket_path.exists():
            raise DaemonUnreachable(f"no meshd agent socket at {self.socket_path} (is meshd running?)")
        self._loop = asyncio.get_running_loop()
        if self.embedded is not None:  # in-process: no socket, no hop to the node
            link = self.embedded.attach(self._incoming.on_frames)
            if not isinstance(link, InProcessLink):
                raise TypeError(f"{type(self.embedded).__name__}.attach returned {type(link).__name__}, "
                                "not an in-process link (connected, pause, resume)")
            self._link = link
            # The SendQueue (meshd/transport.py) is typed for the DEALER this stands in for; it
            # drives any send_multipart (transport.frame_sender).
            sock = cast("zmq.Socket[Any]", link)
        else:
            sock = agent_dealer(zmq.Context.instance())
            sock.connect(f"ipc://{self.socket_path}")
        self._sock = sock
        self._reactor = Reactor(self._loop)
        self._sendq = PrioritySendQueue(sock, self._reactor, self._loop, SEND_QUEUE_LIMIT // self.batch_max)
        if self.embedded is None:
            self._reactor.add(sock, self._incoming.on_frames)
        await self._session.register()  # the session with the daemon: meshd/client/session.py
        if self._link is not None:  # handlers are registered by now (or before the next await)
            self._link.connected = True
        self._hb_task = asyncio.create_task(
            heartbeat_loop(interval=lambda: self.heartbeat_interval,
                           running=lambda: not self._closed and self.evicted is None,
                           expiring=self._expiring, expire=self._expire_control, beat=self._beat),
            name=f"meshd-agent-hb-{self.name}")

    async def close(self) -> None:
        """Unregister (best effort) and release the socket. Idempotent."""
        if self._closed or self._sock is None:
            self._closed = True
            return
        if self._hb_task is not None:
            self._hb_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._hb_task
        self._batcher.flush()
        with contextlib.suppress(MeshError, TimeoutError):
            await self._control({P.KIND: Kind.UNREGISTER}, timeout=1.0)
        self._closed = True
        self._dispatch.cancel_all()
        self._resend.release(DaemonUnreachable("the agent closed before its daemon came back"))
        self._calls.fail_waiting(DaemonUnreachable("agent closed"))
        self._handler_slots.clear()  # never run now (qos-1 ones: not acked, sent again)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(DaemonUnreachable("agent closed"))
        self._pending.clear()
        self._window.unconfirmed.clear()
        self.send_pauses.clear()
        if self._reactor is not None:
            self._reactor.close()
        if self._sendq is not None:
            self._sendq.clear()
        self._sock.close(200)

    # ----------------------------------------------------------------------------- handlers

    def on(self, topic: str = ANY_TOPIC, *, accepts: Any = None, returns: Any = None,
           version: str | None = None, description: str = "",
           examples: list[Any] | None = None) -> Callable[[Handler], Handler]:
        """Decorator: handle messages on ``topic`` ("*" = any topic without its own handler).

        A handler gets a ``Message``; for a request, its return value (or awaited result) is
        the reply, and an exception it raises goes back to the requester as HANDLER_ERROR.

        Typed (docs/contracts.md): with ``accepts`` (a pydantic model class, or a JSON Schema
        map), ``returns``, ``version`` ("MAJOR.MINOR", default "1.0"), ``description`` and
        ``examples``, the topic has a contract. The payload is validated before the handler runs
        (it gets the model instance in ``msg.payload``); one that fails never reaches it: the
        sender gets VALIDATION_FAILED naming the field. A message for another major gets
        SCHEMA_VERSION; one per major may be served side by side (one ``on`` each). The reply is
        checked against ``returns``. Contracts travel with the registration; one declared after
        ``connect`` makes the agent register again (a refusal, e.g. TOO_LARGE, goes to ``on_error``).
        """
        typed = accepts is not None or returns is not None or version is not None or bool(description)
        if typed:
            if topic == ANY_TOPIC or not P.valid_topic(topic):
                raise ValidationFailed(f"a typed handler needs a topic of its own, not {topic!r}")
            parsed = parse_version(version or "1.0")
            if parsed is None:
                raise ValidationFailed(f"version must be 'MAJOR.MINOR', not {version!r}")
            for name, model in (("accepts", accepts), ("returns", returns)):
                if model is not None and not isinstance(model, dict) and not is_model_class(model):
                    raise ValidationFailed(f"{name} must be a model class (model_validate, "
                                           f"model_json_schema) or a JSON Schema map")

        def register(fn: Handler) -> Handler:
            handlers = self._dispatch.handlers
            if not typed:
                handlers[topic] = fn
                return fn
            assert parsed is not None
            table = handlers.get(topic)
            if not isinstance(table, TypedTopic):
                table = TypedTopic(topic, DEFER)
                handlers[topic] = table
            table.add(Contract(topic, parsed, fn, accepts, returns, description, list(examples or [])))
            self._contracts_changed()
            return fn

        return register

    def _contracts_changed(self) -> None:
        """A typed handler was declared on a connected agent: advertise it (once per loop turn)."""
        loop = self._loop
        if self._sock is None or self._closed or self._advertising or loop is None:
            return
        self._advertising = True
        try:
            here = asyncio.get_running_loop() is loop
        except RuntimeError:
            here = False
        if here:
            self._dispatch.spawn(self._advertise())
        else:  # declared from another thread (a BlockingAgent's caller): on the agent's loop
            loop.call_soon_threadsafe(lambda: self._dispatch.spawn(self._advertise()))

    async def _advertise(self) -> None:
        await asyncio.sleep(0)  # the other declarations of this turn go in the same registration
        self._advertising = False
        try:
            await self._session.register()
        except MeshError as exc:
            self._report(exc, None)

    def contracts(self) -> list[dict[str, Any]]:
        """This agent's contract records, as they travel with its registration."""
        return [c.record() for h in self._dispatch.handlers.values() if isinstance(h, TypedTopic)
                for c in (h.majors[m] for m in sorted(h.majors))]

    @property
    def refused(self) -> dict[str, int]:
        """Messages this agent's handlers did not complete, by code: VALIDATION_FAILED and
        SCHEMA_VERSION (refused by a contract before the handler ran), NACK, HANDLER_ERROR."""
        return dict(self._dispatch.refused)

    def set_telemetry(self, **values: Any) -> None:
        """Telemetry sent with every heartbeat (context_used_pct, queue_depth, tasks_summary...)."""
        self.telemetry.update(values)

    @property
    def unsent(self) -> int:
        """Messages queued in this client and not yet taken by the socket (batcher and send queue)."""
        return self._batcher.queued + (len(self._sendq) if self._sendq is not None else 0)

    # ----------------------------------------------------------------------------- primitives

    async def send(self, to: str, topic: str, payload: Any = None, *, qos: int = 0,
                   headers: dict[str, Any] | None = None, version: str | None = None,
                   check: bool = False, priority: int = P.DEFAULT_PRIORITY, msg_id: str | None = None) -> str:
        """Send without waiting for an answer.

        qos 0 (default): at most once; failures arrive later through ``on_error``.
        qos 1: at least once; duplicates are dropped by id, so the handler normally runs once
        (see docs/DELIVERY.md for the crash windows). Returns when the local daemon has the
        message on disk; it retries until the receiver's handler has finished. Refused
        NOT_REGISTERED (the daemon restarted and stored nothing), it is sent again once the
        agent has registered again (docs/DELIVERY.md).
        Returns the message id, which a later ``on_error`` (e.g. UNDELIVERABLE) names.

        ``payload`` may be a model instance (sent as ``model_dump(mode="json")``); ``version``
        names the contract version it was written for (header ``sv``); ``check=True`` checks
        it against the receiver's advertised contract first (``request`` has both too).
        ``msg_id``: an id chosen by the caller, for one that passes on a message identified
        elsewhere (``meshd bridge``): sent again with the same id, it is the same qos-1 unit.
        """
        if qos not in (0, 1):
            raise ValidationFailed("qos must be 0 or 1")
        if priority != P.DEFAULT_PRIORITY:
            _check_priority(priority)
        if msg_id is None:
            msg_id = P.new_id()
        elif not 0 < len(msg_id) <= P.MAX_ID_LEN:
            raise ValidationFailed(f"msg_id must be 1-{P.MAX_ID_LEN} characters")
        header: dict[str, Any] = {P.KIND: Kind.SEND, P.ID: msg_id, P.TOPIC: topic, P.TIMESTAMP: P.timestamp()}
        if headers:
            header[P.HEADERS] = headers
        if version is not None or check or type(payload) not in _PLAIN:
            payload = await self._typed(header, to, topic, payload, version, check)
        data = self._encode(payload, self.max_payload_bytes)  # as _payload, one call less
        span = None
        if (t := tracing.tracer()) is not None:  # None without an SDK: no span, no header copy
            span = tracing.start_producer(t, "send", to, self.name, msg_id, header, P.HEADERS)
            if qos == 0:
                span.end()  # handed on; a later failure comes through on_error
        if qos == 0:  # the README's loop: no coroutine but this one, no loop turn unless one is due
            key: BatchKey = (P.TO, to, 0, priority)
            if self._resend.holding:  # the daemon is restarting: sent once registered again
                self._require_loop()
                if await self._resend.hold_new(msg_id, (key, header, data)):
                    return msg_id
            if self.send_pauses.sent(msg_id, to):  # a full inbox pauses sends to it (send_pause.py)
                await self.send_pauses.before_send(to)
            self._require_loop()
            self._batcher.enqueue(key, header, data)
            if self.embedded is None:  # an embedded node never restarts under its agent
                self._resend.remember(msg_id, (key, header, data))
            if (sendq := self._sendq) is not None and len(sendq) > sendq.limit:  # _backpressure, inline
                await sendq.writable.wait()
            return msg_id
        loop = self._require_loop()
        if span is not None:
            return str(await tracing.until_answered(span, self._send_qos1(loop, msg_id, to, header, data,
                                                                          priority)))
        return await self._send_qos1(loop, msg_id, to, header, data, priority)

    async def _send_qos1(self, loop: asyncio.AbstractEventLoop, msg_id: str, to: str,
                         header: dict[str, Any], data: bytes, priority: int) -> str:
        """A qos-1 send: until the local daemon has it on disk, sent again after a daemon restart."""
        await self._calls.wait(CONTROL_TIMEOUT * 2)
        try:
            for _ in range(QOS1_RESENDS + 1):
                if self._resend.holding:  # the daemon restarts: sent once registered again
                    err = await self._resend.until_released()
                    if err is not None:
                        raise err
                fut: asyncio.Future[Any] = loop.create_future()
                self._pending[msg_id] = fut
                # No timer per message (qos-1 sends come in thousands): the heartbeat loop sweeps.
                self._expiring[msg_id] = time.monotonic() + CONTROL_TIMEOUT * 2
                self._enqueue((P.TO, to, 1, priority), header, data)
                try:
                    await fut
                    return msg_id
                except NotRegistered:
                    # A restarted daemon forgot this agent and stored nothing: the agent registers
                    # again (incoming.py), then this send goes again with the same id.
                    if not self._resend.holding:
                        raise  # no re-registration under way: the agent closed or was evicted
            raise NotRegistered(f"qos-1 send {msg_id}: refused {QOS1_RESENDS + 1} times by daemons "
                                "that had forgotten this agent")
        finally:
            self._pending.pop(msg_id, None)
            self._expiring.pop(msg_id, None)
            self._calls.give_back()

    async def request(self, to: str, topic: str, payload: Any = None, *,
                      timeout: float = DEFAULT_REQUEST_TIMEOUT,
                      headers: dict[str, Any] | None = None,
                      on_progress: Callable[[str], Any] | None = None,
                      version: str | None = None, check: bool = False,
                      priority: int = P.DEFAULT_PRIORITY, hops: int = 0) -> Any:
        """Send a request and return the reply's payload; never waits longer than ``timeout``.

        ``on_progress(note)`` is called when the handler reports progress. Cancelling the
        awaiting task (or the timeout passing) tells the handler it may stop. ``priority`` 0
        (urgent) .. 9, default 5: lower is served first wherever it waits. ``hops``: the
        hops the request has made already, for one that passes on a request from elsewhere
        (``meshd bridge``), so the daemons' hop limit holds across the whole way.
        """
        if not timeout or timeout <= 0:
            raise ValidationFailed("timeout must be a positive number of seconds")
        if priority != P.DEFAULT_PRIORITY:
            _check_priority(priority)
        if not 0 <= hops <= P.MAX_HOPS:
            raise ValidationFailed(f"hops must be 0..{P.MAX_HOPS}")
        loop = self._require_loop()
        msg_id = P.new_request_id()
        header: dict[str, Any] = {P.KIND: Kind.REQUEST, P.ID: msg_id, P.TOPIC: topic,
                                  P.TIMESTAMP: P.timestamp()}
        if headers:
            header[P.HEADERS] = headers
        if hops:
            header[P.HOPS] = hops
        if version is not None or check or type(payload) not in _PLAIN:
            payload = await self._typed(header, to, topic, payload, version, check)
        data = self._payload(payload)
        if not self._calls.try_take():  # in_flight_max calls await answers: wait for room, in order
            timeout -= await self._calls.wait(timeout, RequestTimeout(f"no reply from {to!r} on "
                                             f"{topic!r} within {timeout:g} s (not sent: no room)"))
        header[P.BUDGET] = P.budget_ms(timeout)  # a duration, never a clock reading
        if hops:  # never batched, like a delegation: the daemon checks its hops
            header |= {P.FROM: self.name, P.TO: to}
            send = functools.partial(self._push_alone, header, data)
        else:
            send = functools.partial(self._enqueue, (P.TO, to, 0, priority), header, data)
        answer = self._await_reply(loop, msg_id, to, topic, timeout, on_progress, send)
        if (t := tracing.tracer()) is not None:
            span = tracing.start_producer(t, "request", to, self.name, msg_id, header, P.HEADERS,
                                          conversation=msg_id)
            return await tracing.until_answered(span, answer)
        return await answer

    def _push_alone(self, header: dict[str, Any], data: bytes) -> None:
        self._batcher.flush()
        self._push(P.frames(header, data))

    async def _typed(self, header: dict[str, Any], to: str, topic: str, payload: Any,
                     version: str | None, check: bool) -> Any:
        """A typed send or request: the version into the header, a model into plain data, and
        with ``check`` the payload checked against the receiver's advertised contract."""
        if version is not None:
            if parse_version(version) is None:
                raise ValidationFailed(f"version must be 'MAJOR.MINOR', not {version!r}")
            header[SCHEMA_VERSION] = version
        payload = to_wire(payload)
        if check:
            checked = await self.check_contract(to, topic, payload, version)
            if version is None and checked is not None:
                header[SCHEMA_VERSION] = checked  # it was written for the contract it was checked against
        return payload

    async def describe(self, name: str) -> list[dict[str, Any]]:
        """The contract records agent ``name`` advertises (from the mesh directory; [] if untyped).
        Raises NoSuchAgent if the directory has no such agent."""
        result = await self._control({P.KIND: Kind.QUERY, P.WHAT: "contracts", P.TO: name})
        records = list(result or [])
        return records if check_records(records) is None else []

    async def check_contract(self, to: str, topic: str, payload: Any,
                             version: str | None = None) -> str | None:
        """Check ``payload`` against the contract ``to`` advertises for ``topic`` (its version's
        major, or the oldest when ``version`` is None), without sending anything: raises
        ValidationFailed naming the field, or SchemaVersionUnsupported listing what is served.
        Returns the version of the contract it checked against; None for a topic without a
        contract (nothing to check)."""
        records = [r for r in await self.describe(to.partition("@")[0]) if r.get("topic") == topic]
        if not records:
            return None
        by_major = {v[0]: r for r in records if (v := parse_version(r.get("version"))) is not None}
        wanted = parse_version(version) if version is not None else (min(by_major), 0)
        rec = by_major.get(wanted[0]) if wanted is not None else None
        if rec is None:
            supported = [format_version(parse_version(by_major[m]["version"]) or (m, 0))
                         for m in sorted(by_major)]
            refusal = SchemaVersionUnsupported(f"{topic}: {to!r} serves no version {version!r}; "
                                               f"supported: {', '.join(supported)}")
            refusal.details = {"topic": topic, "version": version, "supported": supported}
            raise refusal
        schema = rec.get("accepts")
        if isinstance(schema, dict):
            problems = schema_errors(schema, payload, 1)
            if problems:
                where, text = problems[0]
                err = ValidationFailed(f"{topic} v{rec['version']}: field {where!r}: {text} "
                                       "(checked before sending)")
                err.details = {"field": where, "topic": topic, "version": rec["version"]}
                raise err
        return str(rec["version"])

    async def _await_reply(self, loop: asyncio.AbstractEventLoop, msg_id: str, to: str, topic: str,
                           timeout: float, on_progress: Callable[[str], Any] | None,
                           send: Callable[[], None]) -> Any:
        fut: asyncio.Future[Any] = loop.create_future()
        self._pending[msg_id] = fut
        if on_progress is not None:
            self._progress_cbs[msg_id] = on_progress
        self._calls.deadlines.add(loop, msg_id, timeout, self._expire, msg_id, to, topic, timeout)
        try:
            send()
            return await fut
        except (asyncio.CancelledError, RequestTimeout):
            self._dispatch.send_cancel(to, msg_id)
            raise
        finally:
            self._calls.deadlines.discard(msg_id)
            self._pending.pop(msg_id, None)
            self._progress_cbs.pop(msg_id, None)
            self._calls.give_back()

    def gather(self, topic: str, payload: Any = None, *, to: Iterable[str] | None = None,
               capability: str | None = None, subscribers_of: str | None = None,
               want: int | None = None, timeout: float = DEFAULT_REQUEST_TIMEOUT,
               headers: dict[str, Any] | None = None,
               on_progress: Callable[[str, str], Any] | None = None,
               priority: int = P.DEFAULT_PRIORITY) -> Gather:
        """Scatter-gather: request ``topic`` of every target and yield replies as they come.

        Targets: ``to`` (names), or every agent of the mesh with ``capability``, or subscribing
        to ``subscribers_of`` (meshd/client/gather.py). It ends at ``want`` replies, when every
        target has answered or failed, or at ``timeout``; then ``summary`` says who replied,
        failed (with its code), timed out or was unreachable. Ending early cancels the
        outstanding requests. ``on_progress(target, note)`` as for ``request``::

            async for reply in me.gather("verify", claim, capability="search", want=2, timeout=5):
                ...
        """
        return Gather(self, topic, payload, to=to, capability=capability, subscribers_of=subscribers_of,
                      want=want, timeout=timeout, headers=headers, on_progress=on_progress,
                      priority=priority)

    async def reply(self, msg: Message, payload: Any = None, *, status: str | None = None) -> None:
        """Answer a request later (its handler returned ``DEFER``); goes to the original requester.

        On a typed topic the payload is checked against the contract's ``returns`` first: one that
        does not fit fails the request with HANDLER_ERROR (the answering side's bug) and raises
        ValidationFailed here, naming the field."""
        if not msg.is_request:
            raise ValidationFailed("only requests can be replied to")
        table = self._dispatch.handlers.get(msg.topic)
        if isinstance(table, TypedTopic) and not msg._answered:
            try:
                payload = table.pick(msg.schema_version).answer(payload)
            except ContractRefused:
                pass  # not a version it serves: the request was refused already
            except HandlerError as exc:
                self._dispatch.reply_error(msg, exc.code, exc.message)
                raise ValidationFailed(exc.message) from None
        self._dispatch.reply(msg, payload, status=status)

    async def fail(self, msg: Message, error: BaseException | str, *, code: str = "HANDLER_ERROR") -> None:
        """Answer a request later with an error (HANDLER_ERROR unless ``code`` says otherwise); a
        :class:`MeshError`'s ``retry``, ``retry_after``, ``fallback`` and details travel with it."""
        text = str(error) or type(error).__name__
        remote_type = type(error).__name__ if isinstance(error, BaseException) else None
        if isinstance(error, MeshError):  # its hints travel: retry, retry_after, fallback, details
            self._dispatch.reply_error_body(msg, P.error_body(
                code, text, retry=error.retry, retry_after=error.retry_after, remote_type=remote_type,
                fallback=error.fallback, details=error.details))
            return
        self._dispatch.reply_error(msg, code, text, remote_type=remote_type)

    async def delegate(self, msg: Message, to: str, *, topic: str | None = None,
                       payload: Any = DEFER) -> None:
        """Forward a request to ``to``; its reply goes straight to the original requester.

        Keeps the original correlation id and requester, counts one more hop (the daemon stops it
        past the hop limit with HOP_LIMIT), and passes on only the time the requester has left.
        """
        if not msg.is_request:
            raise ValidationFailed("only requests can be delegated")
        if msg.deadline is not None and msg.deadline <= time.monotonic():
            raise RequestTimeout("the request's deadline has passed; not delegating it")
        header: dict[str, Any] = {
            P.KIND: Kind.REQUEST, P.ID: P.new_id(), P.FROM: self.name, P.TO: to,
            P.TOPIC: topic or msg.topic, P.CORR: msg.correlation_id or msg.id,
            P.ORIGIN: msg.reply_to or msg.sender, P.HOPS: msg.hops + 1,
        }
        if msg.deadline is not None:
            header[P.BUDGET] = P.budget_left(msg.deadline)  # what is left, minus the time spent here
        if msg.headers:
            header[P.HEADERS] = msg.headers
        data = self._payload(msg.payload if payload is DEFER else payload)
        if (t := tracing.tracer()) is not None:  # the trace goes on under this handler's span
            tracing.start_producer(t, "delegate", to, self.name, header[P.ID], header, P.HEADERS,
                                   conversation=header[P.CORR], parent=msg._span).end()
        self._dispatch.handed_on(msg)  # the delegate answers; this handler's return value is ignored
        # Remember where it went, so a cancel from the requester follows it down the chain.
        self._dispatch.delegated(header[P.CORR], to, msg.sender)
        self._batcher.flush()
        self._push(P.frames(header, data))  # never batched: the daemon checks its hops

    async def handoff(self, to: str, task_id: str, context: Any = None, artifacts: Any = None, *,
                      timeout: float = DEFAULT_REQUEST_TIMEOUT,
                      priority: int = P.DEFAULT_PRIORITY) -> HandoffResult:
        """Hand a task to another agent (topic ``handoff-task``); returns its accept or reject."""
        reply = await self.request(to, P.HANDOFF_TOPIC,
                                   {"task_id": task_id, "context": context, "artifacts": artifacts},
                                   timeout=timeout, priority=priority)
        if isinstance(reply, dict):
            return HandoffResult(bool(reply.get("accepted", False)), reply.get("reason"), reply.get("data"))
        return HandoffResult(bool(reply))

    async def publish(self, topic: str, payload: Any = None, *, qos: int = 0,
                      headers: dict[str, Any] | None = None, reach: bool = False,
                      version: str | None = None, priority: int = P.DEFAULT_PRIORITY) -> int | None:
        """Publish on ``topic``.

        By default (qos 0) it returns as soon as the message is queued, like ``send``, and
        returns None: a loop of publishes pays no round trip each, and they leave in batches.
        Failures arrive through ``on_error`` (with the publish id). The daemon still confirms each
        publish (or batch) in the background; more than ``PUBLISH_WINDOW`` unconfirmed, and
        ``publish`` waits for half of them (DaemonUnreachable if none come within 5 s).

        ``reach=True``: wait for the daemon and return how many subscribers (in the whole mesh)
        it reached. With ``qos=1``, durable subscribers (``subscribe(topic, durable=True)``) get
        it at least once and handle it once, through the publisher daemon's outbox; it returns
        (the reach count) once those copies are on disk.

        ``payload`` may be a model instance; ``version`` names the contract version it was written
        for (a subscriber's typed handler validates it; one it refuses is counted there).
        """
        if not P.valid_topic(topic) or T.is_pattern(topic):
            raise ValidationFailed(f"invalid topic {topic!r} (wildcards are for subscriptions)")
        if qos not in (0, 1):
            raise ValidationFailed("qos must be 0 or 1")
        if priority != P.DEFAULT_PRIORITY:
            _check_priority(priority)
        loop = self._require_loop()
        msg_id = P.new_id()
        header: dict[str, Any] = {P.KIND: Kind.PUBLISH, P.ID: msg_id, P.TOPIC: topic,
                                  P.TIMESTAMP: P.timestamp()}
        if headers:
            header[P.HEADERS] = headers
        if version is not None or type(payload) not in _PLAIN:
            payload = await self._typed(header, "", topic, payload, version, False)
        data = self._payload(payload)
        t = tracing.tracer()
        if qos == 0 and not reach:
            if t is not None:
                tracing.start_producer(t, "publish", topic, self.name, msg_id, header, P.HEADERS).end()
            window = self._window
            await window.wait_pause(loop)
            window.unconfirmed.add(msg_id)
            self._enqueue((P.TOPIC, topic, 0, priority), header, data)
            if self._handler_slots.paused:  # its confirmation must be read
                self._handler_slots.check_reading()
            if window.full():
                await window.wait_room(self.socket_path)
            else:
                await self._backpressure()
            return None
        await self._calls.wait(CONTROL_TIMEOUT)
        fut: asyncio.Future[Any] = loop.create_future()
        self._pending[msg_id] = fut
        # No timer per publish (they are many and fast): the heartbeat loop expires stragglers.
        self._expiring[msg_id] = time.monotonic() + CONTROL_TIMEOUT
        try:
            if t is not None:
                span = tracing.start_producer(t, "publish", topic, self.name, msg_id, header, P.HEADERS)
                self._enqueue((P.TOPIC, topic, qos, priority), header, data)
                return int(await tracing.until_answered(span, fut))
            self._enqueue((P.TOPIC, topic, qos, priority), header, data)
            return int(await fut)
        finally:
            self._pending.pop(msg_id, None)
            self._expiring.pop(msg_id, None)
            self._calls.give_back()

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

    # ------------------------------------------------------------------------- syscall tools

    async def tools(self, *, format: str | None = None) -> list[dict[str, Any]]:
        """The tools this daemon serves: name, description, input_schema, side_effects, plugin
        (or, with ``format`` = ``openai`` / ``anthropic`` / ``mcp``, the shape that API takes)."""
        from meshd.wire.system_names import TOPIC_LIST

        result = await system_request(self, TOPIC_LIST, {"format": format} if format else None,
                                      CONTROL_TIMEOUT)
        return list(result or [])

    async def call_tool(self, name: str, args: dict[str, Any] | None = None, *,
                        timeout: float = DEFAULT_REQUEST_TIMEOUT,
                        on_progress: Callable[[str], Any] | None = None,
                        headers: dict[str, Any] | None = None) -> Any:
        """Call tool ``name`` with ``args`` on the local daemon and return its result. Failures are
        typed: NoSuchTool, ValidationFailed (names the field), Forbidden, QuotaExceeded,
        ApprovalDenied, NotWired, NoSuchAgent (a tool's target, answered at once),
        RequestTimeout (no answer within ``timeout``). ``on_progress(note)`` sees the notes
        of a call that takes long: the target's ``progress`` relayed by ``request_agent``, a
        call held for approval, ``wait_task``'s task changing state. Cancelling the awaiting
        task cancels the call (and the request it made). ``headers``: as ``request``'s (an edge's
        ``traceparent``: what the tool does goes on in that trace)."""
        from meshd.wire.system_names import TOPIC_CALL

        return await system_request(self, TOPIC_CALL, {"name": name, "args": args or {}}, timeout,
                                    on_progress=on_progress, headers=headers)

    # ----------------------------------------------------------------------------- internals

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self.evicted is not None:
            raise self.evicted
        if self._loop is None or self._closed:
            raise DaemonUnreachable("agent is not connected")
        return self._loop

    def _call_soon(self, fn: Callable[[], None]) -> None:
        if self._reactor is not None:  # inside a drain: at its end, this loop turn (Reactor.soon)
            self._reactor.soon(fn)

    def _payload(self, payload: Any) -> bytes:
        return self._encode(payload, self.max_payload_bytes)  # ValidationFailed, TooLarge

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
        timeout -= await self._calls.wait(timeout)
        fut: asyncio.Future[Any] = loop.create_future()
        self._pending[msg_id] = fut
        timer = loop.call_later(timeout, self._expire_control, msg_id)
        try:
            self._batcher.flush()
            self._push(P.frames(header, P.pack(body) if body is not None else b""))
            return await fut
        finally:
            timer.cancel()
            self._pending.pop(msg_id, None)
            self._calls.give_back()

    def _enqueue(self, key: BatchKey, header: dict[str, Any], payload: bytes) -> None:
        self._require_loop()
        self._batcher.enqueue(key, header, payload)

    def _reading(self, on: bool) -> None:  # meshd/client/handler_slots.py pauses and resumes reading
        if self._reactor is not None and self._sock is not None:
            (self._reactor.resume if on else self._reactor.pause)(self._sock)
        elif self._link is not None:
            (self._link.resume if on else self._link.pause)()

    def _dispatch_parked(self, header: dict[str, Any], payload: bytes, unit: str | None) -> None:
        """``HandlerSlots`` runs work through this (parked work, mostly): the dispatcher is built
        after the slots, which it tells of each handler task."""
        self._dispatch.dispatch(header, payload, unit)

    @property
    def in_flight_max(self) -> int | None:
        """Calls this agent keeps awaiting answers at once (docs/client.md, "Calls in flight")."""
        return self._calls.size

    def _busy(self) -> bool:
        return self._sendq is not None and len(self._sendq) > 0

    def _push(self, frames: list[bytes]) -> None:
        assert self._sendq is not None, "the agent is not connected"
        self._sendq.push(frames)

    def _push_data(self, frames: list[bytes], priority: int) -> None:
        """Data from the batcher: what waits for the socket goes lowest priority first."""
        assert self._sendq is not None, "the agent is not connected"
        self._sendq.push_data(frames, priority)

    async def _backpressure(self) -> None:
        sendq = self._sendq
        if sendq is not None and len(sendq) > sendq.limit:
            await sendq.writable.wait()

    def _on_error(self, header: dict[str, Any]) -> None:
        """An error envelope from the daemon (``Incoming.on_error``, meshd/client/incoming.py)."""
        self._incoming.on_error(header)

    def _report(self, err: MeshError, msg_id: str | None) -> int:
        """An error no call awaits: counted, then to ``on_error``. 0 if it took it, else the errors
        counted so far (``Incoming`` logs it)."""
        self.errors_received += 1
        if self.on_error is not None:
            self.on_error(err, msg_id)
            return 0
        return self.errors_received

    def _report_held(self, err: MeshError, msg_id: str) -> None:
        """A held send that cannot go again (registering again failed): report it."""
        self._report(err, msg_id)

    def _evict(self, err: MeshError) -> None:
        """Another node's earlier registration of this name won (``Incoming.on_error``)."""
        self.evicted = err

    def _count_forged(self) -> None:
        self.forged_errors += 1

    def _hello(self) -> dict[str, Any]:
        """The register body (``Session.register``), with the contract records of typed topics."""
        body: dict[str, Any] = {"name": self.name, "capabilities": self.capabilities,
                                "metadata": self.metadata, "credit": CREDIT_WINDOW}
        contracts = self.contracts()
        if contracts:
            body["contracts"] = contracts
        return body

    def _registered(self, node: str | None, node_name: str | None, beat: float | None) -> None:
        """What the register answer said (``Session.register``): the daemon's node, and the
        interval it wants beats at, at least (PROTOCOL.md §8.2)."""
        self.node = node
        self.node_name = node_name
        if beat is not None and beat < self.heartbeat_interval:
            self.heartbeat_interval = beat

    def _grant(self, read: int) -> None:
        """Credit mode: tell the daemon how many work messages this agent has read in all."""
        if not self._closed and self._sock is not None and self._sendq is not None:
            self._push(P.frames({P.KIND: Kind.CREDIT, P.READ: read}))

    def _beat(self) -> None:  # heartbeat_loop's, every heartbeat_interval
        if self.auto_heartbeat:
            self.heartbeat()

    def heartbeat(self) -> None:
        """Send one heartbeat now, with :attr:`telemetry` (``queue_depth`` defaults to the handlers
        running). The agent calls it every ``heartbeat_interval`` unless ``auto_heartbeat=False``."""
        if self._closed or self._sock is None:
            return
        slots = self._handler_slots
        depth = len(self._dispatch.tasks) + len(slots.parked)
        # waiting/lag_s: the consumer lag, messages waiting for a handler slot and the oldest's age
        telemetry = {"queue_depth": depth, "waiting": len(slots.parked), "lag_s": round(slots.lag(), 3),
                     "read": self._incoming.work_read,
                     "credit_read": self._incoming.credit_read} | self.telemetry
        self._push(P.frames({P.KIND: Kind.AGENT_HEARTBEAT}, P.pack(telemetry)))


CREDIT_WINDOW = 32
"""The credit window this client asks for at register: the daemon keeps the rest of its inbox in
its own memory, by priority (docs/PROTOCOL.md §8.11)."""

MAX_READ_AHEAD = 100_000
"""The most work an agent may read ahead into its own memory while its handlers are busy."""


def _check_priority(priority: object) -> None:
    if type(priority) is not int or not 0 <= priority <= P.MAX_PRIORITY:
        raise ValidationFailed(f"priority must be an integer 0..{P.MAX_PRIORITY}, not {priority!r}")


__all__ = ["DEFER", "Agent", "HandoffResult", "Message"]
