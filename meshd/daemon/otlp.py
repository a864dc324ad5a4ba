"""The daemon's own spans, exported over OTLP/HTTP when ``otlp_endpoint`` (``--otlp URL``) is set.

The agents inside the daemon (gateway sessions, the tool service's system agent, the task
scheduler) use the client library, which traces through the global tracer provider
(meshd/client/tracing.py); setting one here is all it takes. Off by default: without the setting
nothing is imported and no span is made. The SDK and exporter come with the ``otel-export`` extra;
asked for without them, the daemon refuses to start (a config error, exit 2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from meshd.errors import ConfigError

TRACES_PATH = "/v1/traces"


def traces_url(endpoint: str) -> str:
    """A base URL (``http://host:4318``) gets OTLP/HTTP's traces path; a full one is kept."""
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        parts = parts._replace(path=TRACES_PATH)
    return urlunsplit(parts)


def start_export(endpoint: str, node_name: str) -> Callable[[], None]:
    """Install a tracer provider that batches spans to ``endpoint``; returns its shutdown (which
    flushes what is left, bounded by the exporter's timeout)."""
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigError("otlp_endpoint", f"the OpenTelemetry SDK or OTLP exporter is not installed "
                          f"({exc.name}); install meshd-daemon[otel-export]") from None
    resource = Resource.create({"service.name": "meshd", "service.instance.id": node_name})
    provider: Any = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint),
                                                                    timeout=5)))
    trace.set_tracer_provider(provider)
    shutdown: Callable[[], None] = provider.shutdown
    return shutdown
