"""``meshd run --otlp URL``: the daemon's own spans reach a real OTLP/HTTP receiver.

The receiver is an HTTP server on 127.0.0.1 that decodes each export with opentelemetry-proto (as
a collector does). The daemon's gateway session makes a request for an HTTP caller: its PRODUCER
span continues the caller's trace, and the agent that answers sees that span as its parent.
"""

from __future__ import annotations

import asyncio
import http.server
import secrets
import threading
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from meshd import Agent
from meshd.testing import MeshdFactory, wait_listed, wait_until


class Receiver(http.server.ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), ReceiverHandler)
        self.spans: list[tuple[dict[str, Any], Span]] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()


class ReceiverHandler(http.server.BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        request = ExportTraceServiceRequest.FromString(body)
        with self.server.lock:
            self.server.paths.append(self.path)
            for rs in request.resource_spans:
                resource = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
                for ss in rs.scope_spans:
                    self.server.spans.extend((resource, span) for span in ss.spans)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_otlp_export_of_the_daemons_spans(meshd_factory: MeshdFactory, receiver: Receiver) -> None:
    url = f"http://127.0.0.1:{receiver.server_address[1]}"
    a = meshd_factory.spawn("a", "--otlp", url)
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)

    async def scenario() -> str:
        async with Agent("echo", socket=a.socket) as echo:
            echo.on("ask")(lambda msg: msg.headers.get("traceparent"))
            gw = a.gateway()
            auth = {"Authorization": f"Bearer {gw.token}"}
            async with aiohttp.ClientSession() as http:
                async with http.post(gw.url + "v1/agents/register", json={"name": "planner"},
                                     headers=auth) as r:
                    sid = (await r.json())["session_id"]
                await wait_listed(echo, "planner")
                async with http.post(gw.url + "v1/request", json={
                        "session_id": sid, "target": "echo", "topic": "ask", "timeout": 10},
                        headers={**auth, "traceparent": f"00-{trace_id}-{caller_span}-01"}) as r:
                    body = await r.json()
                    assert r.status == 200, body
                    return str(body["payload"])

    seen = asyncio.run(scenario())
    assert a.stop() == 0  # SIGTERM: the batched spans are flushed on the way out

    def exported() -> Span | None:
        with receiver.lock:
            return next((s for _, s in receiver.spans if s.name == "request echo"), None)
    span = wait_until(exported, 10, what="the daemon's 'request echo' span at the receiver")
    assert span is not None
    assert receiver.paths and set(receiver.paths) == {"/v1/traces"}
    assert span.trace_id.hex() == trace_id and span.parent_span_id.hex() == caller_span
    assert span.kind == Span.SPAN_KIND_PRODUCER
    attrs = {kv.key: kv.value.string_value for kv in span.attributes}
    assert attrs["messaging.system"] == "meshd" and attrs["messaging.client.id"] == "planner"
    resource = next(r for r, s in receiver.spans if s.name == "request echo")
    assert resource["service.name"] == "meshd" and resource["service.instance.id"] == "a"
    # the answering agent (no SDK of its own) saw the daemon's span as its message's parent
    assert seen == f"00-{trace_id}-{span.span_id.hex()}-01"


def test_otlp_endpoint_must_be_a_url(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a", "--otlp", "ftp://collector", start=False)
    log = a.start_refused("--otlp ftp://")
    assert "otlp_endpoint" in log
