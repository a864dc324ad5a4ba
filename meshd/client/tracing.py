"""OpenTelemetry spans for the agent library, by the messaging semantic conventions.

Optional twice over: without ``opentelemetry-api`` installed (the ``otel`` extra) nothing here
imports it, and with the API but no SDK configured ``tracer()`` answers None after one cheap
look, so the send and receive paths make no span, no context and no header copy. Once an SDK's
provider is set (it can be set only once per process) the tracer is looked up once and kept.

Context travels in the message's application headers as W3C ``traceparent``/``tracestate``
(docs/PROTOCOL.md, ``headers``); daemons carry them untouched, so a qos-1 retry or a dead-letter
replay keeps the original trace. A caller that passes a ``traceparent`` in ``headers`` itself (an
edge: the HTTP gateway, MCP, A2A) names the parent: the producer span continues that trace.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Mapping
from types import CoroutineType
from typing import TYPE_CHECKING, Any

from meshd.errors import MeshError
from meshd.wire import protocol as P

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

try:
    from opentelemetry import context as _context
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
    from opentelemetry.trace import (
        NonRecordingSpan,
        NoOpTracerProvider,
        ProxyTracerProvider,
        SpanContext,
        SpanKind,
        StatusCode,
        TraceFlags,
        TraceState,
    )
    API = True
except ImportError:  # the otel extra is not installed: every entry point answers "not tracing"
    API = False

SYSTEM = "meshd"
TRACE_HEADERS = ("traceparent", "tracestate")
"""The W3C trace-context headers an edge copies between its protocol and mesh headers."""
MAX_TRACE_HEADER = 512
"""Longer values are not trace context (traceparent is 55 chars; tracestate is capped at 512)."""
HANDLER_ERROR: str = P.ErrorCode.HANDLER_ERROR
"""What a process span whose handler raised says in ``error.type`` (the requester hears that code)."""

_tracer: Tracer | None = None
_UNSET = object()


def tracer() -> Tracer | None:
    """meshd's tracer, or None when no SDK is configured in this process (the nil-cost guard).

    Asked twice per message, so the no-SDK answer reads the API's provider global directly (one
    attribute read; ``get_tracer_provider`` also looks the environment up on every call); an API
    without that global, or a provider named in the environment, takes the public way."""
    global _tracer
    if _tracer is not None:
        return _tracer
    if not API:
        return None
    if not _PROVIDER_FROM_ENV and getattr(_trace, "_TRACER_PROVIDER", _UNSET) is None:
        return None
    provider = _trace.get_tracer_provider()
    if isinstance(provider, ProxyTracerProvider | NoOpTracerProvider):
        return None  # not kept: an SDK may be configured later (agents set theirs up at start)
    _tracer = provider.get_tracer("meshd")
    return _tracer


_PROVIDER_FROM_ENV = API and "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


class _Instruments:
    """The OpenTelemetry messaging metrics, made once a meter provider is configured."""

    def __init__(self, provider: Any) -> None:
        meter = provider.get_meter("meshd")
        self.duration = meter.create_histogram(
            "messaging.client.operation.duration", unit="s",
            description="Duration of a send, request or publish, until handed on or answered.")
        self.sent = meter.create_counter("messaging.client.sent.messages", unit="{message}",
                                         description="Messages this client sent.")
        self.consumed = meter.create_counter("messaging.client.consumed.messages", unit="{message}",
                                             description="Messages this client handed to a handler.")
        self.process = meter.create_histogram("messaging.process.duration", unit="s",
                                              description="Duration of a handler, until it finished.")


_instruments: _Instruments | None = None


def instruments() -> _Instruments | None:
    """The messaging metrics, or None without a meter provider (looked up as ``tracer()`` is).
    Recorded only on traced paths: with a tracer and a meter provider both configured."""
    global _instruments
    if _instruments is not None:
        return _instruments
    if not API:
        return None
    from opentelemetry import metrics
    from opentelemetry.metrics import NoOpMeterProvider

    internal = getattr(metrics, "_internal", None)
    if getattr(internal, "_METER_PROVIDER", _UNSET) is None and \
            "OTEL_PYTHON_METER_PROVIDER" not in os.environ:
        return None
    provider = metrics.get_meter_provider()
    if isinstance(provider, NoOpMeterProvider) or type(provider).__name__ == "_ProxyMeterProvider":
        return None
    _instruments = _Instruments(provider)
    return _instruments


def _metric_attrs(span: Span) -> dict[str, Any]:
    attrs = getattr(span, "attributes", None) or {}
    out = {k: attrs[k] for k in ("messaging.system", "messaging.operation.name", "messaging.destination.name")
           if k in attrs}
    if "error.type" in attrs:
        out["error.type"] = attrs["error.type"]
    return out


def trace_headers(source: Mapping[Any, Any]) -> dict[str, str]:
    """The trace-context entries of an edge's headers (HTTP, ``_meta``), ready for mesh headers.

    Case-insensitive keys (HTTP headers); values that are not short strings are dropped, not
    passed on: they come from outside."""
    found: dict[str, str] = {}
    for key, value in source.items():
        name = key.lower() if isinstance(key, str) else None
        if name in TRACE_HEADERS and isinstance(value, str) and 0 < len(value) <= MAX_TRACE_HEADER \
                and value.isascii():
            found[name] = value
    return found


def current_headers() -> dict[str, str]:
    """The current span's context as trace headers (for an edge calling out over HTTP); {} if none."""
    if tracer() is None:
        return {}
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    return {k: v for k, v in carrier.items() if k in TRACE_HEADERS}


def current_ids() -> tuple[str, str] | None:
    """The current span's (trace id, span id) in hex, for log lines written inside a span; None
    without an SDK or outside any span."""
    if tracer() is None:
        return None
    ctx = _trace.get_current_span().get_span_context()
    return (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}") if ctx.is_valid else None


def _remote(headers: Mapping[str, Any]) -> SpanContext | None:
    """The W3C ``traceparent`` (and ``tracestate``) of mesh headers as a remote span context, or
    None if absent or malformed. Parsed here rather than by the global propagator: the protocol
    names these headers, and this is the receive path of every traced message."""
    value = headers.get("traceparent")
    if type(value) is not str or len(value) < 55 or len(value) > MAX_TRACE_HEADER:
        return None
    version, trace_id, span_id, flags = value[:2], value[3:35], value[36:52], value[53:55]
    if value[2] != "-" or value[35] != "-" or value[52] != "-" or version == "ff" \
            or (len(value) > 55 and (version == "00" or value[55] != "-")):
        return None
    try:
        tid, sid, tf = int(trace_id, 16), int(span_id, 16), int(flags, 16)
        int(version, 16)
    except ValueError:
        return None
    if not tid or not sid:
        return None
    state = headers.get("tracestate")
    ts = TraceState.from_header([state]) if type(state) is str and len(state) <= MAX_TRACE_HEADER else None
    return SpanContext(tid, sid, is_remote=True, trace_flags=TraceFlags(tf), trace_state=ts)


def _inject(carried: dict[str, Any], ctx: SpanContext) -> None:
    carried["traceparent"] = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    if ctx.trace_state:
        carried["tracestate"] = ctx.trace_state.to_header()
    else:
        carried.pop("tracestate", None)


def _parent(headers: Mapping[str, Any] | None) -> Context | None:
    """The parent a producer span takes: the caller's explicit traceparent, else the current span."""
    if headers and "traceparent" in headers:
        remote = _remote(headers)
        if remote is not None:
            return _trace.set_span_in_context(NonRecordingSpan(remote))
    return None


def start_producer(t: Tracer, operation: str, destination: str, agent: str, msg_id: str,
                   header: dict[str, Any], headers_key: str, *, conversation: str | None = None,
                   parent: Span | None = None) -> Span:
    """A PRODUCER span ``{operation} {destination}``; its context injected into a copy of the
    message's application headers (the caller's dict is never changed). ``parent``: the handler's
    process span a delegation continues (its headers still name the original producer)."""
    given = header.get(headers_key)
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": operation,
        "messaging.destination.name": destination,
        "messaging.message.id": msg_id,
        "messaging.client.id": agent,
    }
    if conversation:
        attributes["messaging.message.conversation_id"] = conversation
    ctx = _trace.set_span_in_context(parent) if parent is not None else _parent(given)
    span = t.start_span(f"{operation} {destination}", context=ctx, kind=SpanKind.PRODUCER,
                        attributes=attributes)
    carried = dict(given) if given else {}
    _inject(carried, span.get_span_context())
    header[headers_key] = carried
    if (m := instruments()) is not None:
        m.sent.add(1, {"messaging.system": SYSTEM, "messaging.operation.name": operation,
                       "messaging.destination.name": destination})
    return span


def fail(span: Span, exc: BaseException, default: str | None = None) -> None:
    """Mark ``span`` failed with the meshd error code (``error.type``): a MeshError's own, else
    ``default`` (a handler's exception is answered HANDLER_ERROR), else the exception's type."""
    code = exc.code if isinstance(exc, MeshError) else default or type(exc).__qualname__
    span.set_attribute("error.type", str(code))
    span.set_status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:200])
    if default is not None:
        span.record_exception(exc)


async def until_answered(span: Span, answer: Awaitable[Any]) -> Any:
    """Await a request's answer with its PRODUCER span current, and end the span with the outcome
    (and ``messaging.client.operation.duration`` with it, when metrics are configured)."""
    started = time.perf_counter()
    with _trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
        try:
            return await answer
        except BaseException as exc:
            fail(span, exc)
            raise
        finally:
            if (m := instruments()) is not None:
                m.duration.record(time.perf_counter() - started, _metric_attrs(span))


# ------------------------------------------------------------------------------ consumer side

def process_span(t: Tracer, agent: str, kind: str, topic: str, msg_id: str, sender: str,
                 conversation: str | None, headers: Mapping[str, Any]) -> Span:
    """A CONSUMER ``process {topic}`` span around one message's handler: child of the producer's
    context (one message, one process span, as the conventions recommend) and linked to it."""
    producer = _remote(headers) if "traceparent" in headers else None
    parent = _trace.set_span_in_context(NonRecordingSpan(producer)) if producer is not None else None
    links = [_trace.Link(producer)] if producer is not None else None
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": kind,
        "messaging.destination.name": topic,
        "messaging.message.id": msg_id,
        "messaging.client.id": agent,
        "meshd.sender": sender,
    }
    if conversation:
        attributes["messaging.message.conversation_id"] = conversation
    return t.start_span(f"process {topic}", context=parent, kind=SpanKind.CONSUMER,
                        attributes=attributes, links=links)


def traced_handler(span: Span, handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``handler`` run with ``span`` current; the span ends when the handler has finished (an
    ``async def`` handler's coroutine stays a coroutine, so the eager first step still works)."""

    def run(msg: Any) -> Any:
        if (m := instruments()) is not None:
            m.consumed.add(1, _metric_attrs(span))
        token = _context.attach(_trace.set_span_in_context(span))
        started = time.perf_counter()
        try:
            result = handler(msg)
        except BaseException as exc:
            fail(span, exc, HANDLER_ERROR)
            _end_process(span, started)
            raise
        finally:
            _context.detach(token)
        if type(result) is CoroutineType or isinstance(result, Awaitable):
            return _finish_process(span, result, started)
        _end_process(span, started)
        return result

    return run


def _end_process(span: Span, started: float) -> None:
    span.end()
    if (m := instruments()) is not None:
        m.process.record(time.perf_counter() - started, _metric_attrs(span))


async def _finish_process(span: Span, result: Awaitable[Any], started: float) -> Any:
    token = _context.attach(_trace.set_span_in_context(span))
    try:
        return await result
    except BaseException as exc:
        fail(span, exc, HANDLER_ERROR)
        raise
    finally:
        _context.detach(token)
        _end_process(span, started)


def settle_span(t: Tracer, agent: str, unit: str, parent: Span, error: str | None) -> None:
    """A qos-1 unit's ack (or nack, with ``error.type``) to the daemon: the conventions' "settle"."""
    attributes: dict[str, Any] = {"messaging.system": SYSTEM, "messaging.operation.type": "settle",
                                  "messaging.operation.name": "nack" if error is not None else "ack",
                                  "messaging.message.id": unit, "messaging.client.id": agent}
    if error is not None:
        attributes["error.type"] = error
    span = t.start_span(f"{attributes['messaging.operation.name']} {agent}",
                        context=_trace.set_span_in_context(parent),
                        kind=SpanKind.CONSUMER, attributes=attributes)
    if error is not None:
        span.set_status(StatusCode.ERROR)
    span.end()


def answer_span(t: Tracer, operation: str, to: str, agent: str, corr: str,
                parent: Span | None, error: str | None = None) -> None:
    """The reply, error answer or progress note as a short PRODUCER span of its own, under the
    handler's process span (``parent``) when there is one."""
    ctx = _trace.set_span_in_context(parent) if parent is not None else None
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": operation,
        "messaging.destination.name": to,
        "messaging.client.id": agent,
        "messaging.message.conversation_id": corr,
    }
    if error is not None:
        attributes["error.type"] = error
    span = t.start_span(f"{operation} {to}", context=ctx, kind=SpanKind.PRODUCER, attributes=attributes)
    if error is not None:
        span.set_status(StatusCode.ERROR)
    span.end()
