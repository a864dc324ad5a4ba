"""Running an agent's handlers: the handler table, cancel, deadlines, replies and qos-1 acks.

Owns: :class:`Message` (what a handler sees), ``DEFER``, the topic -> handler table, the tasks of
running handlers (so a cancel from the requester reaches the right one, and a delegated request's
cancel follows it), the count of messages left per qos-1 unit and the acks sent when a unit is
done, and the reply and error envelopes an answer becomes.

Must not touch: the socket, frame parsing or batching. It is handed an ``enqueue`` (a message to
a destination, batched by :mod:`meshd.client.batching`) and a ``push`` (frames that leave at once: acks),
and never awaits the daemon.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import time
import traceback
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass, field
from types import CoroutineType
from typing import Any

from meshd.client import tracing
from meshd.client.batching import BatchKey, to_agent
from meshd.client.contracts import ContractRefused, to_wire
from meshd.errors import MeshError, Nack
from meshd.wire import protocol as P
from meshd.wire import topics as T
from meshd.wire.contracts import SCHEMA_VERSION
from meshd.wire.payloads import decode_payload
from meshd.wire.protocol import Kind

__all__ = ["ACK_EVERY", "ANY_TOPIC", "DEFER", "HANDLED_WINDOW", "Dispatcher", "Handler", "Message"]

ACK_EVERY = 16
"""Handled qos-1 messages after which their acks leave at once, even in the middle of a drain of
the agent socket (else they leave when the drain ends). It bounds what a kill -9 of the agent
makes run twice (docs/DELIVERY.md): a drain of hundreds of messages held every ack until its end."""

HANDLED_WINDOW = 10_000
"""qos-1 units an agent remembers having handled (docs/DELIVERY.md): a redelivery of one of them
after its daemon restarted is acked again, not handled again."""

log = logging.getLogger("meshd.client")

ANY_TOPIC = "*"
MAX_DELEGATED = 10_000
"""Delegations remembered (so a cancel can follow them); the oldest is forgotten past this."""
PROGRESS_NOTE_CHARS = 200
TRACE_BYTES = 3000
"""The tail (UTF-8 bytes) of a handler's traceback that travels with its HANDLER_ERROR when the agent opted in
(``Agent(debug=True)``); without it none does."""



EARLY_CANCELS_MAX = 1024
"""Cancels remembered for requests that have not started yet (per agent)."""

class _Deferred:
    def __repr__(self) -> str:
        return "meshd.DEFER"


DEFER: Any = _Deferred()
"""Return this from a request handler to answer later with ``Agent.reply`` (or ``fail``)."""


@dataclass(slots=True)
class Message:
    """A message as a handler sees it.

    For a request, ``reply_to`` and ``correlation_id`` say where the answer goes: the original
    requester and its id, even when the request was delegated along the way. ``deadline`` is a
    ``time.monotonic()`` value of this host (the requester's budget, counted from arrival), never
    a wall-clock time: use ``time_left``.
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
    _dispatcher: Dispatcher | None = None
    _answered: bool = False
    _cancelled: asyncio.Event | None = None
    #: The contract version the sender wrote the message for (header ``sv``), None if it named none.
    schema_version: str | None = None
    #: When the sender made it (header ``ts``, ISO-8601 UTC): for people and logs, never compared
    #: with this host's clock (use ``time_left`` for deadlines). None from senders that omit it.
    timestamp: str | None = None
    #: The handler's CONSUMER span when tracing (meshd/client/tracing.py): answers and delegations
    #: made later, outside the handler, still belong under it.
    _span: Any = None

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
        return None if self.deadline is None else self.deadline - time.monotonic()

    async def progress(self, note: str = "working") -> None:
        """Tell the requester the handler is still working (its ``on_progress`` sees ``note``)."""
        if self._dispatcher is not None and self.is_request:
            self._dispatcher.progress(self, note)


Handler = Callable[[Message], Any]


class _Resume:
    """Awaitable that goes on with a coroutine already stepped to its first suspension.

    ``_Resume(coro, first)`` hands the awaiting task ``first`` (what the coroutine yielded: the
    future it waits on, or None for a bare yield), then passes every later send and throw (a
    cancel included) straight to ``coro``: the task sees the handler as if it had run it from
    the start.
    """

    __slots__ = ("_coro", "_first", "_started")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any) -> None:
        self._coro = coro
        self._first = first
        self._started = False

    def __await__(self) -> Generator[Any, Any, Any]:
        return self  # an iterator with send and throw, as ``yield from`` wants

    def __iter__(self) -> _Resume:
        return self

    def __next__(self) -> Any:
        return self.send(None)

    def send(self, value: Any) -> Any:
        if not self._started:
            self._started = True
            return self._first
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        # ``yield from`` passes (type, value, traceback); pass one exception instance on.
        exc = val if isinstance(val, BaseException) else typ if isinstance(typ, BaseException) else typ()
        self._started = True
        return self._coro.throw(exc)

    def close(self) -> None:
        self._coro.close()


class Dispatcher:
    """Runs handlers for one agent; a handler that raises fails that one request, nothing more."""

    def __init__(self, agent_name: str, *, enqueue: Callable[[BatchKey, dict[str, Any], bytes], None],
                 push: Callable[[list[bytes]], None], encode: Callable[[Any], bytes],
                 schedule: Callable[[Callable[[], None]], None], closed: Callable[[], bool],
                 on_handler_task: Callable[[asyncio.Task[Any]], None] | None = None,
                 debug: bool = False) -> None:
        """``debug``: a handler's failure carries its traceback (``trace``, at most
        ``TRACE_BYTES``) to the requester; off by default, so stack traces stay home.
        ``on_handler_task(task)`` is told of each handler that suspended and got a task (the
        ``Agent`` gives its ``HandlerSlots.handler_started``, meshd/client/handler_slots.py)."""
        self.agent_name = agent_name
        self._enqueue = enqueue
        self._push = push
        self._encode = encode
        self._schedule = schedule
        self._closed = closed
        self.handlers: dict[str, Handler] = {}
        #: Tasks of running async handlers (and other background work): the heartbeat's queue depth.
        self.tasks: set[asyncio.Task[Any]] = set()
        self._running: dict[str, tuple[asyncio.Task[Any], Message]] = {}
        self._delegated: dict[str, tuple[str, str]] = {}  # corr -> (delegate, who asked us)
        #: Cancels that came before their request started (it waited inside a parked batch, or the
        #: cancel overtook it): corr -> requester. The request is refused CANCELLED when it comes.
        self._early_cancels: dict[str, str] = {}
        self._unit_left: dict[str, int] = {}
        #: qos-1 units a handler refused (``Nack``), with its error map: nacked, not acked, when done.
        self._unit_nack: dict[str, dict[str, Any]] = {}
        #: A traced qos-1 unit's last process span: its ack (or nack) is a span under it. Empty
        #: (and never looked into) without an SDK.
        self._unit_span: dict[str, Any] = {}
        #: The last ``HANDLED_WINDOW`` qos-1 units this agent handled: a daemon that died before
        #: writing their done-marks redelivers them, and they are acked again, not run again.
        self._handled: OrderedDict[str, None] = OrderedDict()
        self.redelivered = 0
        self._no_handler_logged: set[str] = set()  # topics warned about once (bounded)
        self._acks: list[str] = []
        self._ack_scheduled = False
        self._handled_unacked = 0  # messages whose unit's ack has not left yet (see ACK_EVERY)
        self._on_handler_task = on_handler_task
        self.debug = debug
        #: Messages refused before or instead of their handler, by code: ``VALIDATION_FAILED``
        #: and ``SCHEMA_VERSION`` (a typed topic's contract refused them), ``NACK`` (the handler
        #: refused explicitly), ``HANDLER_ERROR`` (it raised).
        self.refused: Counter[str] = Counter()

    # ------------------------------------------------------------------------ incoming

    def seen_unit(self, unit: str) -> bool:
        """Is this qos-1 unit a redelivery? Handled already: ack it again; still running: its
        ack follows when it is done. Either way the handlers must not run (again)."""
        if unit in self._handled:
            self.redelivered += 1
            self._ack(unit)
            return True
        if unit in self._unit_left:
            self.redelivered += 1
            return True
        return False

    def begin_unit(self, unit: str | None, messages: int) -> None:
        """A qos-1 unit of ``messages`` arrived; it is acked once each of them was handled."""
        if unit is not None:
            self._unit_left[unit] = messages

    def dispatch(self, header: dict[str, Any], payload: bytes, unit: str | None = None) -> None:
        """Run the handler for one send, request or publication."""
        try:
            self._run_handler(header, payload, unit)
        except BaseException:
            self.unit_done(unit)
            raise

    def runner(self, unit: str | None) -> Callable[[dict[str, Any], bytes, str | None], None]:
        """``dispatch`` for the messages of one frame set: for qos 0 (no unit to finish when a
        handler raises) the handler runner itself, one call less per message."""
        return self._run_handler if unit is None else self.dispatch

    def cancel(self, header: dict[str, Any]) -> bool:
        """A cancel from a requester: stop its running handler, pass it on to a delegate.
        Returns whether it found the request (running or delegated)."""
        corr = str(header.get(P.CORR))
        found = False
        running = self._running.get(corr)
        if running is not None and running[1].sender == header.get(P.FROM):
            task, msg = running
            msg.cancelled.set()
            task.cancel()
            found = True
        delegated = self._delegated.get(corr)
        if delegated is not None and delegated[1] == header.get(P.FROM):
            del self._delegated[corr]
            self.send_cancel(delegated[0], corr)  # pass it on to whoever has the work now
            found = True
        return found

    def remember_cancel(self, header: dict[str, Any]) -> None:
        """A cancel for a request not started yet: it is refused CANCELLED when it comes (bounded:
        the oldest remembered cancel is forgotten first)."""
        early = self._early_cancels
        if len(early) >= EARLY_CANCELS_MAX:
            del early[next(iter(early))]
        early[str(header.get(P.CORR))] = str(header.get(P.FROM, ""))

    def _run_handler(self, header: dict[str, Any], payload: bytes, unit: str | None) -> None:
        # The receive path of every message (its cost caps one-way msgs/s): header fields read once, the
        # ``Message`` built positionally (keywords cost ~0.3 us more per message), the deadline
        # read only when the header carries one, and ``unit_done`` called only for qos 1.
        get = header.get
        topic = str(get(P.TOPIC, ""))
        handlers = self.handlers
        handler = handlers.get(topic) or T.handler_for(handlers, topic) or handlers.get(ANY_TOPIC)
        kind = header[P.KIND]
        is_request = kind == Kind.REQUEST
        msg_id = str(get(P.ID, ""))
        corr = get(P.CORR)
        sender = str(get(P.FROM, ""))
        hops = get(P.HOPS, 0)
        deadline = None
        bad_budget = ""
        if P.BUDGET in header or P.DEADLINE in header:
            try:
                # The requester's budget starts counting now, on this host's monotonic clock.
                deadline = P.local_deadline(header)
            except P.FrameError as exc:
                bad_budget = str(exc)
        # Positional, in the field order of ``Message``: id, kind, topic, sender, to, payload,
        # correlation_id, deadline, headers, reply_to, hops, qos, _dispatcher.
        msg = Message(msg_id, kind, topic, sender, get(P.TO), None,
                      (str(corr) if corr else msg_id) if is_request else corr,
                      deadline, get(P.HEADERS) or {}, str(get(P.ORIGIN) or sender),
                      hops if isinstance(hops, int) else 0, 0 if unit is None else 1, self)
        if SCHEMA_VERSION in header:
            sv = header[SCHEMA_VERSION]
            msg.schema_version = sv if type(sv) is str else None
        ts = get(P.TIMESTAMP)
        if type(ts) is str:
            msg.timestamp = ts
        if is_request and self._early_cancels and self._early_cancels.get(str(msg.correlation_id)) == sender:
            del self._early_cancels[str(msg.correlation_id)]
            self.reply_error(msg, P.ErrorCode.CANCELLED, "cancelled by the requester")
            self.unit_done(unit)
            return
        if bad_budget:
            if is_request:
                self.reply_error(msg, P.ErrorCode.VALIDATION_FAILED, bad_budget)
            self.unit_done(unit)
            return
        try:
            msg.payload = decode_payload(payload)
        except Exception as exc:
            if is_request:
                self.reply_error(msg, P.ErrorCode.VALIDATION_FAILED, f"payload undecodable: {exc}")
            self.unit_done(unit)
            return
        if handler is None:
            # Never dropped in silence: a request gets HANDLER_ERROR, a send (qos 0 or 1) becomes
            # the receiving daemon's dead letter HANDLER_ERROR, as if its handler had raised.
            reason = f"agent {self.agent_name!r} has no handler for topic {topic!r}"
            if is_request:
                self.reply_error(msg, P.ErrorCode.HANDLER_ERROR, reason)
            else:
                if topic not in self._no_handler_logged and len(self._no_handler_logged) < 1024:
                    self._no_handler_logged.add(topic)
                    log.warning("%s (sends to it are dead letters HANDLER_ERROR at this agent's daemon; "
                                "register handlers before connecting)", reason)
                self._report_send_failure(msg, P.error_body(P.ErrorCode.HANDLER_ERROR, reason[:500],
                                                            remote_type="NoHandler"))
            self.unit_done(unit)
            return
        if is_request and deadline is not None and deadline <= time.monotonic():
            # The requester has given up already: do not start work nobody waits for.
            self.reply_error(msg, P.ErrorCode.TIMEOUT, "the deadline passed before the handler started")
            self.unit_done(unit)
            return
        if (t := tracing.tracer()) is not None:  # None without an SDK: the handler runs as it is
            msg._span = span = tracing.process_span(t, self.agent_name, kind, topic, msg_id, sender,
                                                    msg.correlation_id, msg.headers)
            if unit is not None and len(self._unit_span) < HANDLED_WINDOW:
                self._unit_span[unit] = span
            handler = tracing.traced_handler(span, handler)
        try:
            result = handler(msg)
        except Exception as exc:
            self._handler_failed(msg, exc, unit)
            self.unit_done(unit)
            return
        if type(result) is CoroutineType:
            self._run_eagerly(msg, result, unit)
            return
        if inspect.isawaitable(result):
            self._start_task(msg, self._finish(msg, result, unit), None)
            return
        if is_request:
            self._answer(msg, result)
        if unit is not None:
            self.unit_done(unit)

    def _run_eagerly(self, msg: Message, coro: Coroutine[Any, Any, Any], unit: str | None) -> None:
        """Step an ``async def`` handler at once, in a context of its own (as a task would); only
        if it suspends does it get a task, which resumes it where it stopped. A handler that
        finishes without suspending thus costs about what a plain function does, not a task per message."""
        ctx = contextvars.copy_context()
        try:
            first = ctx.run(coro.send, None)
        except StopIteration as done:
            if msg.kind == Kind.REQUEST:
                self._answer(msg, done.value)
            if unit is not None:
                self.unit_done(unit)
            return
        except Exception as exc:
            self._handler_failed(msg, exc, unit)
            self.unit_done(unit)
            return
        self._start_task(msg, self._finish(msg, _Resume(coro, first), unit), ctx)

    def _start_task(self, msg: Message, finish: Coroutine[Any, Any, None],
                    ctx: contextvars.Context | None) -> None:
        task = asyncio.get_running_loop().create_task(finish, context=ctx)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if self._on_handler_task is not None:
            self._on_handler_task(task)
        if msg.is_request and msg.correlation_id:
            key = msg.correlation_id
            self._running[key] = (task, msg)
            task.add_done_callback(functools.partial(self._forget_running, key, msg))

    async def _finish(self, msg: Message, result: Awaitable[Any], unit: str | None) -> None:
        try:
            value = await result
        except asyncio.CancelledError:
            if msg.cancelled.is_set():
                self.reply_error(msg, P.ErrorCode.CANCELLED, "cancelled by the requester")
                self.unit_done(unit)
                return
            raise
        except Exception as exc:
            self._handler_failed(msg, exc, unit)
            self.unit_done(unit)
            return
        if msg.is_request:
            self._answer(msg, value)
        self.unit_done(unit)

    def _forget_running(self, key: str, msg: Message, task: asyncio.Task[Any]) -> None:
        self._running.pop(key, None)
        if task.cancelled() and msg.cancelled.is_set():
            # Cancelled before its task's first step (the cancel came in the same loop turn):
            # ``_finish`` never ran, so the requester's CANCELLED answer is sent from here.
            self.reply_error(msg, P.ErrorCode.CANCELLED, "cancelled by the requester")

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` as a task the agent cancels when it closes."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def cancel_all(self) -> None:
        for task in list(self.tasks):
            task.cancel()

    # ------------------------------------------------------------------------ qos-1 acks

    def unit_done(self, unit: str | None) -> None:
        """One message of a qos-1 unit finished; when all have, ack the unit to the daemon."""
        if unit is None:
            return
        self._handled_unacked += 1
        left = self._unit_left.get(unit, 1) - 1
        if left > 0:
            self._unit_left[unit] = left
            return
        self._unit_left.pop(unit, None)
        nack = self._unit_nack.pop(unit, None) if self._unit_nack else None
        if self._unit_span and (span := self._unit_span.pop(unit, None)) is not None \
                and (t := tracing.tracer()) is not None:
            code = None if nack is None else str(nack.get("code"))
            tracing.settle_span(t, self.agent_name, unit, span, code)
        if nack is not None:
            if nack.get("retry") is not True:
                self._handled[unit] = None  # not retried: a late copy is acked, not run
            if not self._closed():
                self._push(P.frames({P.KIND: Kind.NACK, P.ID: unit, P.ERROR: nack}))
            return
        self._handled[unit] = None
        if len(self._handled) > HANDLED_WINDOW:
            self._handled.popitem(last=False)
        self._ack(unit)

    def _ack(self, unit: str) -> None:
        self._acks.append(unit)
        if self._handled_unacked >= ACK_EVERY:
            self._send_acks()  # the scheduled flush, if any, finds what came after
        elif not self._ack_scheduled:
            self._ack_scheduled = True
            self._schedule(self._flush_acks)

    def _flush_acks(self) -> None:
        self._ack_scheduled = False
        self._send_acks()

    def _send_acks(self) -> None:
        acks, self._acks = self._acks, []
        self._handled_unacked = 0
        if self._closed() or not acks:
            return
        for chunk in P.chunk_ids(acks):  # each header within the daemon's cap, or it is refused
            self._push(P.frames({P.KIND: Kind.ACK, P.IDS: chunk}))

    # ------------------------------------------------------------------------ answers

    def _answer(self, msg: Message, value: Any) -> None:
        if msg._answered or value is DEFER:
            return
        self.reply(msg, value)

    def _handler_failed(self, msg: Message, exc: Exception, unit: str | None = None) -> None:
        if type(exc) is ContractRefused:  # refused before the handler ran: counted, not logged
            self._refuse(msg, exc.error)
            return
        if isinstance(exc, Nack):  # the handler's explicit refusal, with its hints
            self._refuse(msg, exc, unit)
            return
        self.refused[P.ErrorCode.HANDLER_ERROR] += 1
        log.warning("agent %s: handler for %r raised %s: %s", self.agent_name, msg.topic,
                    type(exc).__name__, exc)
        if msg.is_request:
            # Bounded: an exception's text can be any size, and an answer past the header cap
            # would be refused, leaving the requester to time out instead of hearing the error.
            err = P.error_body(P.ErrorCode.HANDLER_ERROR, (str(exc) or type(exc).__name__)[:500],
                               remote_type=type(exc).__name__[:100])
            if self.debug:  # the agent opted in: its stack trace travels (bounded)
                trace = "".join(traceback.format_exception(exc)).encode()[-TRACE_BYTES:]
                err["trace"] = trace.decode(errors="ignore")  # within the 8 KiB header
            self.reply_error_body(msg, err)
        else:
            self._report_send_failure(msg, P.error_body(P.ErrorCode.HANDLER_ERROR,
                                                        (str(exc) or type(exc).__name__)[:500],
                                                        remote_type=type(exc).__name__[:100]))

    def _refuse(self, msg: Message, err: MeshError, unit: str | None = None) -> None:
        """A contract's refusal or a ``Nack``: to the requester, or reported for a send (the
        daemon dead-letters it and tells the sender). A qos-1 unit's NACK goes instead of its
        ack, once all its messages are done (``unit_done``): the outbox honours its hints."""
        self.refused[err.code] += 1
        body = P.error_body(err.code, err.message[:500], retry=err.retry, retry_after=err.retry_after,
                            fallback=err.fallback, details=err.details)
        if unit is not None and err.code == P.ErrorCode.NACK:
            self._unit_nack.setdefault(unit, body)
            return
        if msg.is_request:
            self.reply_error_body(msg, body)
        else:
            self._report_send_failure(msg, body)

    def _report_send_failure(self, msg: Message, err: dict[str, Any]) -> None:
        """A send that no handler completed is reported to our daemon (never answered: the daemon
        keeps it as a dead letter, HANDLER_ERROR or ``validation``, tells observers, and passes a
        contract's refusal or a NACK on to the sender as a notice). Never batched."""
        if msg.kind != Kind.SEND or self._closed():
            return
        header: dict[str, Any] = {P.KIND: Kind.ERROR, P.ID: P.new_id(), P.FROM: self.agent_name,
                                  P.TO: msg.sender, P.CORR: msg.id, P.TOPIC: msg.topic, P.ERROR: err}
        if msg.qos:
            header[P.QOS] = 1  # its sender hears from the outbox, not from a notice
        self._push(P.frames(header))

    def reply(self, msg: Message, value: Any, status: str | None = None) -> None:
        """The reply to ``msg``, to its original requester; a handoff reply gets its verdict."""
        if self._closed():
            return
        msg._answered = True
        if msg.topic == P.HANDOFF_TOPIC and status is None:
            # One verdict, used for the header (daemons and observers) and the payload alike:
            # True/False, or a dict whose "accepted" says it (a dict without it is a reject).
            accepted = bool(value.get("accepted", False)) if isinstance(value, dict) else bool(value)
            value = ({**value, "accepted": accepted} if isinstance(value, dict) else {"accepted": accepted})
            status = "accepted" if accepted else "rejected"
        try:
            data = self._encode(to_wire(value))
        except MeshError as exc:
            self.reply_error(msg, exc.code, f"reply refused: {exc.message}")
            return
        if (t := tracing.tracer()) is not None:
            tracing.answer_span(t, "reply", msg.reply_to or msg.sender, self.agent_name,
                                msg.correlation_id or msg.id, msg._span)
        header = {P.KIND: Kind.REPLY, P.ID: P.new_id(), P.TIMESTAMP: P.timestamp(),
                  P.CORR: msg.correlation_id or msg.id,
                  P.TOPIC: msg.topic}
        if status is not None:
            header[P.STATUS] = status
        self._enqueue(to_agent(msg.reply_to or msg.sender), header, data)

    def reply_error(self, msg: Message, code: str, message: str, remote_type: str | None = None, *,
                    retry: bool = False, retry_after: float | None = None) -> None:
        """An error envelope for ``msg`` to its original requester (once per message)."""
        if self._closed() or not msg.sender or msg._answered:
            return
        self.reply_error_body(msg, P.error_body(code, message, retry=retry, retry_after=retry_after,
                                                remote_type=remote_type))

    def reply_error_body(self, msg: Message, err: dict[str, Any]) -> None:
        """``reply_error`` with the ``error`` map built already (``P.error_body``)."""
        if self._closed() or not msg.sender or msg._answered:
            return
        msg._answered = True
        if (t := tracing.tracer()) is not None:
            tracing.answer_span(t, "reply", msg.reply_to or msg.sender, self.agent_name,
                                msg.correlation_id or msg.id, msg._span, error=str(err.get("code")))
        header = {P.KIND: Kind.ERROR, P.ID: P.new_id(), P.CORR: msg.correlation_id or msg.id, P.ERROR: err,
                  P.TIMESTAMP: P.timestamp()}
        self._enqueue(to_agent(msg.reply_to or msg.sender), header, b"")

    def progress(self, msg: Message, note: str) -> None:
        if (t := tracing.tracer()) is not None:
            tracing.answer_span(t, "progress", msg.reply_to or msg.sender, self.agent_name,
                                msg.correlation_id or msg.id, msg._span)
        header = {P.KIND: Kind.PROGRESS, P.ID: P.new_id(), P.TIMESTAMP: P.timestamp(),
                  P.CORR: msg.correlation_id or msg.id,
                  P.NOTE: note[:PROGRESS_NOTE_CHARS]}
        self._enqueue(to_agent(msg.reply_to or msg.sender), header, b"")

    def send_cancel(self, to: str, msg_id: str) -> None:
        if self._closed():
            return
        try:
            self._enqueue(to_agent(to), {P.KIND: Kind.CANCEL, P.ID: P.new_id(), P.CORR: msg_id}, b"")
        except MeshError:
            pass

    def handed_on(self, msg: Message) -> None:
        """``msg`` was delegated (``Agent.delegate``): the delegate answers it, so its handler's
        return value is no answer."""
        msg._answered = True

    def delegated(self, corr: str, to: str, asked_by: str) -> None:
        """Remember where a request went, so a cancel from the requester follows it down the chain."""
        self._delegated[corr] = (to, asked_by)
        while len(self._delegated) > MAX_DELEGATED:
            self._delegated.pop(next(iter(self._delegated)))
