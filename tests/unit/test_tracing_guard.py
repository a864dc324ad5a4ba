"""The nil-cost guard of meshd/client/tracing.py: no SDK, no span; an SDK set later is found.

Each case runs in a fresh interpreter: a tracer provider can be set only once per process, and
the test process must stay without one.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_without_the_api_nothing_is_imported_and_nothing_traced() -> None:
    out = run("""
        import sys
        sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
        from meshd.client import tracing
        print(tracing.API, tracing.tracer(), tracing.current_headers())
    """)
    assert out == "False None {}"


def test_api_without_sdk_makes_no_span_and_leaves_headers_alone() -> None:
    out = run("""
        from opentelemetry import trace
        made = []
        original = trace.ProxyTracer.start_span
        trace.ProxyTracer.start_span = lambda self, *a, **k: made.append(a) or original(self, *a, **k)
        from meshd.client import tracing
        from meshd.client.handlers import Dispatcher
        from meshd.wire.payloads import encode_payload
        sent = []
        d = Dispatcher("me", enqueue=lambda key, header, data: sent.append(header), push=lambda f: None,
                       encode=encode_payload, schedule=lambda fn: fn(), closed=lambda: False)
        d.handlers["t"] = lambda msg: msg.headers
        tp = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
        d.dispatch({"kind": "request", "id": "r1", "topic": "t", "from": "you",
                    "headers": {"traceparent": tp}},
                   encode_payload(None))
        print(tracing.tracer(), len(made), len(sent), sent[0]["kind"])
    """)
    assert out == "None 0 1 reply"


def test_an_sdk_configured_after_import_is_used_and_headers_carry_its_context() -> None:
    out = run("""
        from meshd.client import tracing
        assert tracing.tracer() is None
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        t = tracing.tracer()
        given = {"tasks": []}
        header = {"headers": given}
        span = tracing.start_producer(t, "send", "researcher", "planner", "m1", header, "headers")
        span.end()
        tp = header["headers"]["traceparent"]
        (done,) = exporter.get_finished_spans()
        print(given == {"tasks": []}, done.name, done.kind.name,
              tp.split("-")[1] == format(done.context.trace_id, "032x"),
              done.attributes["messaging.destination.name"], done.attributes["messaging.client.id"])
    """)
    assert out == "True send researcher PRODUCER True researcher planner"


def test_trace_headers_from_an_edge_are_bounded_and_case_insensitive() -> None:
    from meshd.client.tracing import trace_headers

    tp = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    assert trace_headers({"TraceParent": tp, "tracestate": "x=1", "other": "y"}) == {
        "traceparent": tp, "tracestate": "x=1"}
    assert trace_headers({"traceparent": "x" * 600, "tracestate": 5}) == {}
    assert trace_headers({"traceparent": "caf\u00e9"}) == {}


def test_a_traceparent_from_the_wire_is_parsed_strictly() -> None:
    from meshd.client.tracing import _remote

    good = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    ctx = _remote({"traceparent": good, "tracestate": "k=v"})
    assert ctx is not None and ctx.is_remote and ctx.trace_id == int("a" * 32, 16)
    assert ctx.trace_state.get("k") == "v"
    for bad in ("", good[:-1], good.replace("-", "_"), "ff" + good[2:], good + "-x",
                "00-" + "0" * 32 + "-" + "b" * 16 + "-01", "00-" + "g" * 32 + "-" + "b" * 16 + "-01",
                good + "-" + "x" * 600, 5, None):
        assert _remote({"traceparent": bad}) is None, bad
    assert _remote({"traceparent": "01-" + "a" * 32 + "-" + "b" * 16 + "-01-future"}) is not None


def test_json_log_lines_carry_the_trace_inside_a_span() -> None:
    out = run("""
        import json, logging
        from meshd.daemon.run import _JsonFormatter
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        record = lambda: logging.LogRecord("meshd", logging.INFO, "x.py", 1, "hello", None, None)
        fmt = _JsonFormatter()
        before = json.loads(fmt.format(record()))
        trace.set_tracer_provider(TracerProvider())
        outside = json.loads(fmt.format(record()))
        with trace.get_tracer("t").start_as_current_span("work") as span:
            inside = json.loads(fmt.format(record()))
        ctx = span.get_span_context()
        print("trace_id" in before, "trace_id" in outside,
              inside["trace_id"] == format(ctx.trace_id, "032x"),
              inside["span_id"] == format(ctx.span_id, "016x"))
    """)
    assert out == "False False True True"


def test_messaging_metrics_with_a_meter_provider() -> None:
    out = run("""
        import asyncio
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from meshd.client import tracing
        from meshd.client.handlers import Dispatcher
        from meshd.wire.payloads import encode_payload
        assert tracing.instruments() is None  # no meter provider yet: nothing made
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        trace.set_tracer_provider(TracerProvider())
        t = tracing.tracer()

        async def ask() -> None:
            header = {}
            span = tracing.start_producer(t, "request", "researcher", "planner", "r1", header, "headers")
            done = asyncio.get_running_loop().create_future()
            done.set_result("ok")
            await tracing.until_answered(span, done)
        asyncio.run(ask())
        d = Dispatcher("me", enqueue=lambda *a: None, push=lambda f: None, encode=encode_payload,
                       schedule=lambda fn: fn(), closed=lambda: False)
        d.handlers["t"] = lambda msg: None
        d.dispatch({"kind": "send", "id": "s1", "topic": "t", "from": "you"}, encode_payload(None))
        got = {}
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    point = metric.data.data_points[0]
                    got[metric.name] = (getattr(point, "value", None) or getattr(point, "count", None),
                                        dict(point.attributes).get("messaging.destination.name"))
        print(sorted(got.items()))
    """)
    assert out == ("[('messaging.client.consumed.messages', (1, 't')), "
                   "('messaging.client.operation.duration', (1, 'researcher')), "
                   "('messaging.client.sent.messages', (1, 'researcher')), "
                   "('messaging.process.duration', (1, 't'))]")


def test_a_gather_is_one_producer_span_with_its_requests_under_it() -> None:
    out = run("""
        import asyncio
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from meshd.client.gather import Gather
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        seen = []

        class Asker:
            name = "planner"
            async def agents(self):
                return []
            async def request(self, to, topic, payload=None, *, timeout, headers=None, **kw):
                seen.append(headers["traceparent"])
                return to

        async def main():
            replies, summary = await Gather(Asker(), "verify", 1, to=["v1", "v2"], timeout=5).collect()
            return sorted(r.sender for r in replies), summary.ended
        print(asyncio.run(main()))
        (span,) = exporter.get_finished_spans()
        sid = format(span.context.span_id, "016x")
        print(span.name, span.kind.name, span.attributes["messaging.batch.message_count"],
              span.attributes["meshd.gather.replied"], all(tp.split("-")[2] == sid for tp in seen), len(seen))
    """)
    assert out.splitlines() == ["(['v1', 'v2'], 'all')", "gather verify PRODUCER 2 2 True 2"]
