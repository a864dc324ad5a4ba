"""meshd-prometheus: Prometheus metrics for a meshd daemon, on ``prometheus_client``.

meshd loads this module through the entry point in pyproject.toml::

    [project.entry-points.meshd]
    prometheus = "meshd_prometheus"

At :func:`meshd_startup` it serves ``GET /metrics`` on ``$MESHD_PROMETHEUS_ADDR:$MESHD_PROMETHEUS_PORT``
(default ``127.0.0.1:9464``) from a ``prometheus_client`` registry holding one custom collector,
:class:`MeshdCollector`; every other path is 404. :func:`meshd_shutdown` stops the server.
``prometheus_client`` writes the exposition format (text 0.0.4, or OpenMetrics when the scraper
asks for it) and runs the threaded HTTP server; this module only decides what to count.

Two kinds of metrics:

* counters kept by this plugin (:class:`Metrics`) from the observer hooks for rare events
  (:func:`meshd_dead_letter`, :func:`meshd_peer_state`, :func:`meshd_agent_state`); they count
  what happened since the plugin started. It implements no ``meshd_collaboration``: an observer
  of that hook receives an event per message, which costs the routing path; the node counts
  collaborations and their latency itself, and this plugin reads those counts;
* gauges and counters read at scrape time from the node's documented face,
  :class:`meshd.view.NodeView`, through ``metrics_snapshot()`` only: an immutable reading the node
  rebuilds on its own loop, safe to take from the scrape thread. Nothing here touches the node's
  internals.

Threads: the observer hooks run on meshd's plugin worker thread, scrapes on the HTTP server's
threads, the lifecycle hooks in the daemon's event loop. :class:`Metrics` is guarded by one lock.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from meshd.hookspecs import hookimpl
from meshd.view import MetricsSnapshot, NodeView

__all__ = [
    "ADDR_ENV",
    "PORT_ENV",
    "PORT_FILE_ENV",
    "Exporter",
    "MeshdCollector",
    "Metrics",
    "collaboration_families",
    "meshd_agent_state",
    "meshd_dead_letter",
    "meshd_peer_state",
    "meshd_shutdown",
    "meshd_startup",
]

ADDR_ENV = "MESHD_PROMETHEUS_ADDR"
PORT_ENV = "MESHD_PROMETHEUS_PORT"
PORT_FILE_ENV = "MESHD_PROMETHEUS_PORT_FILE"
DEFAULT_ADDR = "127.0.0.1"
DEFAULT_PORT = 9464

#: The p50/p99 gauges, over the recent latencies the node keeps of each kind.
QUANTILES = (0.5, 0.99)
#: Distinct label values kept per counter; past it, new values are counted under "other" (a guard
#: against a label explosion, which would hurt the Prometheus server more than this daemon).
MAX_LABEL_VALUES = 500
#: Destinations named in meshd_qos1_outbox_depth (the deepest outboxes; the rest under "other").
MAX_DEST_LABELS = 50
#: The node's own counters exported as meshd_node_events_total{event}.
NODE_EVENTS = ("delivered", "forwarded", "published", "malformed", "qos1_delivered")
STATES = ("online", "one-way", "stale", "offline")
METRICS_PATH = "/metrics"

log = logging.getLogger("meshd_prometheus")


# -- what the observer hooks count ----------------------------------------------------------------


def _quantile(ordered: list[float], q: float) -> float:
    """Nearest-rank quantile of an ascending list (not empty)."""
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


class Metrics:
    """The counters fed by the observer hooks (dead letters, state changes: rare events; the
    per-message collaboration counts come from the node's snapshot). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.dead_letters: Counter[str] = Counter()  # reason
        self.peer_changes: Counter[str] = Counter()  # new state
        self.agent_changes: Counter[str] = Counter()  # new state

    @staticmethod
    def _bump(counter: Counter[Any], key: Any, cap: int = MAX_LABEL_VALUES) -> None:
        if key not in counter and len(counter) >= cap:
            key = tuple("other" for _ in key) if isinstance(key, tuple) else "other"
        counter[key] += 1

    def dead_letter(self, letter: Mapping[str, Any]) -> None:
        with self._lock:
            self._bump(self.dead_letters, str(letter.get("reason") or "unknown"))

    def peer_state(self, new: str) -> None:
        with self._lock:
            self._bump(self.peer_changes, str(new))

    def agent_state(self, new: str) -> None:
        with self._lock:
            self._bump(self.agent_changes, str(new))

    def collect(self) -> Iterator[Metric]:
        """The hook-fed families, from a consistent copy taken under the lock."""
        with self._lock:
            dead = sorted(self.dead_letters.items())
            peers = sorted(self.peer_changes.items())
            agents = sorted(self.agent_changes.items())

        yield _counter("meshd_dead_letters_total",
                       "Dead letters recorded since the plugin started, by reason.",
                       ("reason",), (([r], n) for r, n in dead))
        yield _counter("meshd_peer_state_changes_total",
                       "Peer daemon liveness changes, by the state entered.",
                       ("state",), (([s], n) for s, n in peers))
        yield _counter("meshd_agent_state_changes_total",
                       "This daemon's agents' state changes, by the state entered (absent: left).",
                       ("state",), (([s], n) for s, n in agents))


def _counter(name: str, help_text: str, labels: tuple[str, ...],
             samples: Iterable[tuple[list[str], float]]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_text, labels=labels)
    for values, n in samples:
        family.add_metric(values, n)
    return family


def _gauge(name: str, help_text: str, labels: tuple[str, ...],
           samples: Iterable[tuple[list[str], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=labels)
    for values, n in samples:
        family.add_metric(values, n)
    return family


# -- what is read from the node at scrape time ----------------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def _bounded(counts: Mapping[str, int], cap: int) -> list[tuple[str, int]]:
    """The ``cap`` largest entries, the rest summed under "other" (a bounded label set)."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    kept, rest = ranked[:cap], sum(n for _, n in ranked[cap:])
    return sorted(kept) + ([("other", rest)] if rest else [])


def _by_state(counts: Mapping[str, int]) -> list[tuple[list[str], float]]:
    merged = dict.fromkeys(STATES, 0) | {str(k): int(v) for k, v in counts.items()}
    return [([state], n) for state, n in sorted(merged.items())]


def node_families(snap: MetricsSnapshot) -> Iterator[Metric]:
    """The families read from one :class:`~meshd.view.MetricsSnapshot`."""
    yield _gauge("meshd_node_info", "This daemon's identity (always 1).", ("node", "name", "mesh"),
                 [([snap.node_id, snap.name, snap.mesh], 1)])
    yield GaugeMetricFamily("meshd_uptime_seconds", "Seconds since the node started.", value=snap.uptime_s)
    yield _gauge("meshd_peers", "Known peer daemons, by liveness state.", ("state",),
                 _by_state(snap.peers_by_state))
    yield _gauge("meshd_local_agents", "Agents attached to this daemon, by state.", ("state",),
                 _by_state(snap.local_agents_by_state))
    for key, name, help_text in (
            ("queue_depth", "meshd_agent_queue_depth",
             "Inbox/queue depth a local agent reported in its last heartbeat."),
            ("context_used_pct", "meshd_agent_context_used_percent",
             "Context window use (percent) a local agent reported in its last heartbeat.")):
        values = [(agent, _number(t.get(key))) for agent, t in sorted(snap.agent_telemetry.items())]
        yield _gauge(name, help_text, ("agent",), (([agent], v) for agent, v in values if v is not None))
    lag = sorted(getattr(snap, "agent_lag", {}).items())
    yield _gauge("meshd_agent_waiting_messages",
                 "Consumer lag in messages: written to a local agent and not read yet, plus those it "
                 "holds for a handler slot.", ("agent",), (([a], w) for a, (w, _) in lag))
    yield _gauge("meshd_agent_lag_seconds",
                 "Consumer lag in time: the age of the oldest message a local agent has not handled "
                 "(good to about a second).", ("agent",), (([a], age) for a, (_, age) in lag))
    yield GaugeMetricFamily("meshd_qos1_pending",
                            "qos-1 messages in the durable outbox, not yet acknowledged by their receiver.",
                            value=snap.qos1_pending)
    yield GaugeMetricFamily("meshd_qos1_in_flight", "qos-1 messages sent and awaiting their ack now.",
                            value=snap.qos1_in_flight)
    by_dest = getattr(snap, "qos1_pending_by_dest", {})
    yield _gauge("meshd_qos1_outbox_depth",
                 "qos-1 units in the outbox awaiting their receiver's ack, by destination agent "
                 f"(the {MAX_DEST_LABELS} deepest; the rest summed under \"other\").",
                 ("dest",), (([d], n) for d, n in _bounded(by_dest, MAX_DEST_LABELS)))
    yield CounterMetricFamily("meshd_node_dead_letters_total",
                              "Dead letters recorded by the node since it started (all reasons).",
                              value=snap.dead_letters_total)
    yield _counter("meshd_node_events_total", "The node's own message counters.", ("event",),
                   (([event], _number(snap.events.get(event, 0)) or 0) for event in NODE_EVENTS))
    yield GaugeMetricFamily("meshd_plugin_queue_depth", "Observer events waiting for the plugin worker.",
                            value=snap.plugin_queue)
    yield from collaboration_families(snap)
    messages = sorted(getattr(snap, "messages", {}).items())
    yield _counter("meshd_messages_total",
                   "Messages this daemon's agents sent, by kind and topic (topics past the daemon's "
                   "metrics_topic_labels under \"other\"; a batch to one agent under \"(batch)\").",
                   ("kind", "topic"), ((list(k), n) for k, n in messages))
    hook_time = sorted(getattr(snap, "plugin_hook_time", {}).items())
    yield _counter("meshd_plugin_hook_calls_total", "Calls of each thread-mode plugin's observer hooks.",
                   ("plugin", "hook"), ((list(k), t[0]) for k, t in hook_time))
    yield _counter("meshd_plugin_hook_seconds_total",
                   "Wall time spent in each thread-mode plugin's observer hooks.",
                   ("plugin", "hook"), ((list(k), t[1]) for k, t in hook_time))
    yield _counter("meshd_plugin_hook_cpu_seconds_total",
                   "CPU time each thread-mode plugin's observer hooks held (it slows routing, which "
                   "shares the interpreter).", ("plugin", "hook"), ((list(k), t[2]) for k, t in hook_time))
    yield _counter("meshd_plugin_events_total",
                   "The plugin host's counters (called, dropped, failed:<plugin>, ...).", ("event",),
                   (([event], n) for event, n in sorted(snap.plugin_stats.items()) if _number(n) is not None))


def collaboration_families(snap: MetricsSnapshot) -> Iterator[Metric]:
    """Collaboration counts and latency, as the node itself tallies them (MetricsSnapshot): the
    plugin receives no event per message, so installing it costs the routing path nothing."""
    collaborations = sorted(getattr(snap, "collaborations", {}).items())
    errors = sorted(getattr(snap, "collaboration_errors", {}).items())
    yield _counter("meshd_collaborations_total",
                   "Collaboration outcomes (send, request, delegate, handoff) seen by this daemon.",
                   ("kind", "outcome"), ((list(k), n) for k, n in collaborations))
    yield _counter("meshd_collaboration_errors_total",
                   "Collaborations that ended in an error, by error code.",
                   ("kind", "code"), ((list(k), n) for k, n in errors))
    histogram = HistogramMetricFamily(
        "meshd_request_latency_seconds",
        "Time from a local agent's request (or qos-1 send) to its reply or acknowledgement.",
        labels=("kind",))
    recent = GaugeMetricFamily(
        "meshd_request_latency_recent_seconds",
        "Latency quantiles (p50, p99) over the most recent replies of each kind.",
        labels=("kind", "quantile"))
    for kind, reading in sorted(getattr(snap, "latency", {}).items()):
        cumulative, total = [], 0
        for bound, n in zip((*reading.buckets_s, math.inf), reading.counts, strict=True):
            total += n
            cumulative.append((floatToGoString(bound), total))
        histogram.add_metric([kind], cumulative, reading.sum_s)
        ordered = sorted(reading.recent_s)
        if ordered:
            for q in QUANTILES:
                recent.add_metric([kind, repr(q)], _quantile(ordered, q))
    yield histogram
    yield recent


class MeshdCollector:
    """A ``prometheus_client`` custom collector: the hook-fed metrics and the node's snapshot.

    ``view`` returns the running node's :class:`~meshd.view.NodeView` (None before start-up or after
    shutdown: then only the hook-fed families are collected).
    """

    def __init__(self, metrics: Metrics, view: Callable[[], NodeView | None]) -> None:
        self.metrics = metrics
        self._view = view

    def collect(self) -> Iterator[Metric]:
        yield from self.metrics.collect()
        node = self._view()
        if node is not None:
            yield from node_families(node.metrics_snapshot())

    def describe(self) -> list[Metric]:
        return []  # names vary with the node's counters: never collect at registration time


# -- the HTTP endpoint ----------------------------------------------------------------------------


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


def _only_metrics(app: Callable[..., Any]) -> Callable[..., Any]:
    """``prometheus_client`` answers on every path; keep ``/metrics`` and answer 404 elsewhere."""
    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO") != METRICS_PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"meshd-prometheus serves /metrics only\n"]
        return app(environ, start_response)
    return wrapped


class Exporter:
    """The HTTP endpoint and the node it reads; one per daemon process."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.registry = CollectorRegistry()
        self.registry.register(MeshdCollector(metrics, lambda: self._node))
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, memory, open fds
        self._node: NodeView | None = None
        self._server: ThreadingWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.address: tuple[str, int] | None = None

    @staticmethod
    def configured_address(environ: Mapping[str, str] = os.environ) -> tuple[str, int]:
        addr = environ.get(ADDR_ENV, "").strip() or DEFAULT_ADDR
        raw_port = environ.get(PORT_ENV, "").strip()
        try:
            port = int(raw_port) if raw_port else DEFAULT_PORT
        except ValueError:
            raise ValueError(f"{PORT_ENV}={raw_port!r}: not a port number") from None
        if not 0 <= port <= 65535:
            raise ValueError(f"{PORT_ENV}={port}: a port is 0..65535 (0: any free port)")
        return addr, port

    def start(self, node: NodeView) -> None:
        if not isinstance(node, NodeView):
            raise TypeError("meshd-prometheus needs a node implementing meshd.view.NodeView "
                            f"(got {type(node).__name__}); upgrade meshd")
        addr, port = self.configured_address()
        with self._lock:
            if self._server is not None:
                log.warning("meshd-prometheus already serves %s:%s in this process; not starting again",
                            *(self.address or ("?", "?")))
                return
            server_class: type[ThreadingWSGIServer] = ThreadingWSGIServer
            if ":" in addr:  # an IPv6 literal
                server_class = type("_Server6", (ThreadingWSGIServer,), {"address_family": socket.AF_INET6})
            try:
                server = make_server(addr, port, _only_metrics(make_wsgi_app(self.registry)),
                                     server_class, handler_class=_QuietHandler)
            except OSError as exc:
                raise OSError(exc.errno, f"meshd-prometheus cannot listen on {addr}:{port} "
                                         f"({ADDR_ENV}/{PORT_ENV}): {exc.strerror or exc}") from exc
            self._node, self._server = node, server
            self.address = (addr, int(server.server_address[1]))
            self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.25},
                                            name="meshd-prometheus", daemon=True)
            self._thread.start()
        host = f"[{addr}]" if ":" in addr else addr
        log.info("prometheus metrics on http://%s:%d/metrics", host, self.address[1])
        if not _is_loopback(addr):
            log.warning("prometheus metrics are served on %s, beyond this host, without authentication",
                        addr)
        port_file = os.environ.get(PORT_FILE_ENV, "").strip()
        if port_file:
            tmp = f"{port_file}.tmp{os.getpid()}"
            with open(tmp, "w", encoding="ascii") as out:
                out.write(f"{self.address[1]}\n")
            os.replace(tmp, port_file)  # readers never see a half-written file

    def stop(self, timeout: float = 3.0) -> None:
        """Stop serving and close the listening socket, within about ``timeout`` seconds."""
        with self._lock:
            server, thread = self._server, self._thread
            self._server = self._thread = None
            self._node = None
        if server is None:
            return
        deadline = time.monotonic() + timeout
        stopper = threading.Thread(target=server.shutdown, name="meshd-prometheus-stop", daemon=True)
        stopper.start()
        stopper.join(timeout)
        server.server_close()  # the port is free from here on, even if serve_forever lingers
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
        if stopper.is_alive() or (thread is not None and thread.is_alive()):
            log.warning("meshd-prometheus server thread did not stop within %.1f s", timeout)
        else:
            log.info("prometheus metrics server stopped")


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"


METRICS = Metrics()
EXPORTER = Exporter(METRICS)


# -- lifecycle: in the daemon's event loop --------------------------------------------------------


@hookimpl
async def meshd_startup(node: NodeView) -> None:
    """Start the HTTP server. Binding and starting a thread are quick, but they are still done off
    the event loop, which the routing path shares. A bad address or a busy port raises: the daemon
    logs it, counts it as ``failed:prometheus`` and runs on without metrics."""
    await asyncio.to_thread(EXPORTER.start, node)


@hookimpl
async def meshd_shutdown(node: NodeView) -> None:
    """Stop the HTTP server (bounded: well within the daemon's hook timeout)."""
    await asyncio.to_thread(EXPORTER.stop, 3.0)


# -- observers and sinks: on meshd's plugin worker thread -----------------------------------------


@hookimpl
def meshd_dead_letter(letter: dict[str, Any]) -> None:
    """Count the dead letter by reason."""
    METRICS.dead_letter(letter)


@hookimpl
def meshd_peer_state(new: str) -> None:
    """Count the peer state change by the state entered."""
    METRICS.peer_state(new)


@hookimpl
def meshd_agent_state(new: str) -> None:
    """Count the agent state change by the state entered."""
    METRICS.agent_state(new)
