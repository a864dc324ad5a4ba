"""meshd-prometheus: Prometheus metrics for a meshd daemon, over HTTP, with the standard library only.

meshd loads this module through the entry point in pyproject.toml::

    [project.entry-points.meshd]
    prometheus = "meshd_prometheus"

At :func:`meshd_startup` it starts a small HTTP server (``http.server.ThreadingHTTPServer``, in a
daemon thread) on ``$MESHD_PROMETHEUS_ADDR:$MESHD_PROMETHEUS_PORT`` (default ``127.0.0.1:9464``)
that answers ``GET /metrics`` in the Prometheus text exposition format (version 0.0.4) and 404
elsewhere; :func:`meshd_shutdown` stops it. The format is written by hand (it is a few lines of
text per metric), so the plugin needs nothing beyond meshd and installs offline.

Two kinds of metrics:

* counters and a latency histogram kept by this plugin from the observer hooks
  (:func:`meshd_collaboration`, :func:`meshd_dead_letter`, :func:`meshd_peer_state`,
  :func:`meshd_agent_state`); they count what happened since the plugin started;
* gauges and counters read from the node at scrape time (peers, local agents, the qos-1 outbox,
  dead letters, the node's own event counters). The node's attributes are not a stable API, so
  every read is defensive: a metric that cannot be read is left out of that scrape, never an error.

Threads: the observer hooks run on meshd's plugin worker thread, scrapes on the HTTP server's
threads, the lifecycle hooks in the daemon's event loop. The counters are guarded by one lock. The
node's state belongs to its event loop, so a scrape asks the loop to take the snapshot (a few
microseconds of work, once per scrape) and reads the node directly only if the loop does not
answer within a second.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import http.server
import ipaddress
import logging
import math
import os
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any

from meshd.hookspecs import hookimpl

__all__ = [
    "ADDR_ENV",
    "BUCKETS",
    "PORT_ENV",
    "PORT_FILE_ENV",
    "Exporter",
    "Metrics",
    "escape_label_value",
    "meshd_agent_state",
    "meshd_collaboration",
    "meshd_dead_letter",
    "meshd_peer_state",
    "meshd_shutdown",
    "meshd_startup",
    "node_snapshot",
]

ADDR_ENV = "MESHD_PROMETHEUS_ADDR"
PORT_ENV = "MESHD_PROMETHEUS_PORT"
PORT_FILE_ENV = "MESHD_PROMETHEUS_PORT_FILE"
DEFAULT_ADDR = "127.0.0.1"
DEFAULT_PORT = 9464

#: Upper bounds (seconds) of the latency histogram's buckets; ``+Inf`` is added when rendering.
BUCKETS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                              1.0, 2.5, 5.0, 10.0, 30.0)
#: The p50/p99 gauges are computed over the last WINDOW latencies of each kind.
WINDOW = 1024
QUANTILES = (0.5, 0.99)
#: Distinct label values kept per counter; past it, new values are counted under "other" (a guard
#: against a label explosion, which would hurt the Prometheus server more than this daemon).
MAX_LABEL_VALUES = 500
#: The node's own counters exported as meshd_node_events_total{event}.
NODE_EVENTS = ("delivered", "forwarded", "published", "malformed", "qos1_delivered")
STATES = ("online", "stale", "offline")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SNAPSHOT_TIMEOUT = 1.0

log = logging.getLogger("meshd_prometheus")


# -- the text exposition format -------------------------------------------------------------------


def escape_label_value(value: object) -> str:
    """A label value as the text format wants it: backslash, double quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _format_value(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class _Writer:
    """Collects the lines of one scrape."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {_escape_help(help_text)}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float, labels: Mapping[str, object] | None = None) -> None:
        if labels:
            body = ",".join(f'{key}="{escape_label_value(val)}"' for key, val in labels.items())
            self.lines.append(f"{name}{{{body}}} {_format_value(value)}")
        else:
            self.lines.append(f"{name} {_format_value(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


# -- what the observer hooks count ----------------------------------------------------------------


class _Histogram:
    """Cumulative bucket counts, sum and count, plus the last WINDOW observations for quantiles."""

    def __init__(self, buckets: tuple[float, ...], window: int) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # per bucket (not cumulative); the last is +Inf
        self.sum = 0.0
        self.count = 0
        self.recent: deque[float] = deque(maxlen=window)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1  # le is inclusive
        self.sum += value
        self.count += 1
        self.recent.append(value)

    def copy(self) -> _Histogram:
        other = _Histogram(self.buckets, self.recent.maxlen or WINDOW)
        other.counts = list(self.counts)
        other.sum, other.count = self.sum, self.count
        other.recent = deque(self.recent, maxlen=self.recent.maxlen)
        return other


def _quantile(ordered: list[float], q: float) -> float:
    """Nearest-rank quantile of an ascending list (not empty)."""
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


class Metrics:
    """The counters and histograms fed by the observer hooks. Thread-safe."""

    def __init__(self, buckets: tuple[float, ...] = BUCKETS, window: int = WINDOW) -> None:
        self._lock = threading.Lock()
        self._buckets = buckets
        self._window = window
        self.started = time.time()
        self.collaborations: Counter[tuple[str, str]] = Counter()  # (kind, outcome)
        self.collaboration_errors: Counter[tuple[str, str]] = Counter()  # (kind, code)
        self.latency: dict[str, _Histogram] = {}  # kind -> histogram
        self.dead_letters: Counter[str] = Counter()  # reason
        self.peer_changes: Counter[str] = Counter()  # new state
        self.agent_changes: Counter[str] = Counter()  # new state

    @staticmethod
    def _bump(counter: Counter[Any], key: Any, cap: int = MAX_LABEL_VALUES) -> None:
        if key not in counter and len(counter) >= cap:
            key = tuple("other" for _ in key) if isinstance(key, tuple) else "other"
        counter[key] += 1

    def collaboration(self, outcome: Mapping[str, Any]) -> None:
        kind = str(outcome.get("kind") or "unknown")
        result = str(outcome.get("outcome") or "unknown")
        latency_ms = outcome.get("latency_ms")
        with self._lock:
            self._bump(self.collaborations, (kind, result))
            if result == "error":
                self._bump(self.collaboration_errors, (kind, str(outcome.get("error_code") or "ERROR")))
            if isinstance(latency_ms, (int, float)) and not isinstance(latency_ms, bool) \
                    and math.isfinite(latency_ms) and latency_ms >= 0:
                histogram = self.latency.get(kind)
                if histogram is None:
                    if len(self.latency) >= MAX_LABEL_VALUES:
                        return
                    histogram = self.latency[kind] = _Histogram(self._buckets, self._window)
                histogram.observe(latency_ms / 1000.0)

    def dead_letter(self, letter: Mapping[str, Any]) -> None:
        with self._lock:
            self._bump(self.dead_letters, str(letter.get("reason") or "unknown"))

    def peer_state(self, new: str) -> None:
        with self._lock:
            self._bump(self.peer_changes, str(new))

    def agent_state(self, new: str) -> None:
        with self._lock:
            self._bump(self.agent_changes, str(new))

    def render(self, out: _Writer) -> None:
        """Write the hook-fed metrics (a consistent copy taken under the lock)."""
        with self._lock:
            collaborations = sorted(self.collaborations.items())
            errors = sorted(self.collaboration_errors.items())
            latency = {kind: h.copy() for kind, h in sorted(self.latency.items())}
            dead = sorted(self.dead_letters.items())
            peers = sorted(self.peer_changes.items())
            agents = sorted(self.agent_changes.items())

        out.family("meshd_collaborations_total", "counter",
                   "Collaboration outcomes (send, request, delegate, handoff) seen by this daemon.")
        for (kind, result), n in collaborations:
            out.sample("meshd_collaborations_total", n, {"kind": kind, "outcome": result})
        out.family("meshd_collaboration_errors_total", "counter",
                   "Collaborations that ended in an error, by error code.")
        for (kind, code), n in errors:
            out.sample("meshd_collaboration_errors_total", n, {"kind": kind, "code": code})

        out.family("meshd_request_latency_seconds", "histogram",
                   "Time from a local agent's request (or qos-1 send) to its reply or acknowledgement.")
        for kind, h in latency.items():
            cumulative = 0
            for bound, n in zip((*h.buckets, math.inf), h.counts, strict=True):
                cumulative += n
                le = "+Inf" if math.isinf(bound) else repr(bound)
                out.sample("meshd_request_latency_seconds_bucket", cumulative, {"kind": kind, "le": le})
            out.sample("meshd_request_latency_seconds_sum", h.sum, {"kind": kind})
            out.sample("meshd_request_latency_seconds_count", h.count, {"kind": kind})
        out.family("meshd_request_latency_recent_seconds", "gauge",
                   f"Latency quantiles (p50, p99) over the last {self._window} replies of each kind.")
        for kind, h in latency.items():
            ordered = sorted(h.recent)
            if ordered:
                for q in QUANTILES:
                    out.sample("meshd_request_latency_recent_seconds", _quantile(ordered, q),
                               {"kind": kind, "quantile": repr(q)})

        out.family("meshd_dead_letters_total", "counter",
                   "Dead letters recorded since the plugin started, by reason.")
        for reason, n in dead:
            out.sample("meshd_dead_letters_total", n, {"reason": reason})
        out.family("meshd_peer_state_changes_total", "counter",
                   "Peer daemon liveness changes, by the state entered.")
        for state, n in peers:
            out.sample("meshd_peer_state_changes_total", n, {"state": state})
        out.family("meshd_agent_state_changes_total", "counter",
                   "Agent state changes anywhere in the mesh, by the state entered (absent: left).")
        for state, n in agents:
            out.sample("meshd_agent_state_changes_total", n, {"state": state})


# -- what is read from the node at scrape time ----------------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def node_snapshot(node: Any) -> dict[str, Any]:
    """Read what the gauges need from a :class:`meshd.node.Node`, each item on its own: an item
    that cannot be read (an attribute renamed, a dict changed size under us) is left out."""
    snap: dict[str, Any] = {}

    def read(key: str, getter: Callable[[], Any]) -> None:
        for _ in range(3):  # a dict resized by the loop thread mid-copy: try again
            try:
                snap[key] = getter()
                return
            except RuntimeError:
                continue
            except Exception:
                log.debug("cannot read %s from the node", key, exc_info=True)
                return

    # The node's documented NodeView (meshd.view): one consistent, thread-safe reading.
    m = node.metrics_snapshot()
    read("info", lambda: {"node": str(m.node_id), "name": str(m.name), "mesh": str(m.mesh)})
    read("uptime", lambda: m.uptime_s or None)
    read("peers", lambda: dict.fromkeys(STATES, 0) | dict(m.peers_by_state))
    read("local_agents", lambda: dict.fromkeys(STATES, 0) | dict(m.local_agents_by_state))
    read("telemetry", lambda: {k: dict(v) for k, v in m.agent_telemetry.items()})
    read("qos1_pending", lambda: m.qos1_pending)
    read("qos1_in_flight", lambda: m.qos1_in_flight)
    read("dead_letters", lambda: m.dead_letters_total)
    read("stats", lambda: dict(m.events))
    read("plugin_queue", lambda: m.plugin_queue)
    read("plugin_stats", lambda: dict(m.plugin_stats))
    return snap


def _render_node(snap: Mapping[str, Any], out: _Writer) -> None:
    if "info" in snap:
        out.family("meshd_node_info", "gauge", "This daemon's identity (always 1).")
        out.sample("meshd_node_info", 1, snap["info"])
    if _number(snap.get("uptime")) is not None:
        out.family("meshd_uptime_seconds", "gauge", "Seconds since the node started.")
        out.sample("meshd_uptime_seconds", snap["uptime"])
    if "peers" in snap:
        out.family("meshd_peers", "gauge", "Known peer daemons, by liveness state.")
        for state, n in sorted(snap["peers"].items()):
            out.sample("meshd_peers", n, {"state": state})
    if "local_agents" in snap:
        out.family("meshd_local_agents", "gauge", "Agents attached to this daemon, by state.")
        for state, n in sorted(snap["local_agents"].items()):
            out.sample("meshd_local_agents", n, {"state": state})
    if "telemetry" in snap:
        for key, name, help_text in (
                ("queue_depth", "meshd_agent_queue_depth",
                 "Inbox/queue depth a local agent reported in its last heartbeat."),
                ("context_used_pct", "meshd_agent_context_used_percent",
                 "Context window use (percent) a local agent reported in its last heartbeat.")):
            values = [(agent, _number(t.get(key))) for agent, t in sorted(snap["telemetry"].items())
                      if isinstance(t, dict)]
            out.family(name, "gauge", help_text)
            for agent, value in values:
                if value is not None:
                    out.sample(name, value, {"agent": agent})
    if "qos1_pending" in snap:
        out.family("meshd_qos1_pending", "gauge",
                   "qos-1 messages in the durable outbox, not yet acknowledged by their receiver.")
        out.sample("meshd_qos1_pending", snap["qos1_pending"])
    if "qos1_in_flight" in snap:
        out.family("meshd_qos1_in_flight", "gauge", "qos-1 messages sent and awaiting their ack now.")
        out.sample("meshd_qos1_in_flight", snap["qos1_in_flight"])
    if "dead_letters" in snap:
        out.family("meshd_node_dead_letters_total", "counter",
                   "Dead letters recorded by the node since it started (all reasons).")
        out.sample("meshd_node_dead_letters_total", snap["dead_letters"])
    if "stats" in snap:
        stats = snap["stats"]
        out.family("meshd_node_events_total", "counter", "The node's own message counters.")
        for event in NODE_EVENTS:
            value = _number(stats.get(event, 0))
            out.sample("meshd_node_events_total", value or 0, {"event": event})
    if "plugin_queue" in snap:
        out.family("meshd_plugin_queue_depth", "gauge", "Observer events waiting for the plugin worker.")
        out.sample("meshd_plugin_queue_depth", snap["plugin_queue"])
    if "plugin_stats" in snap:
        out.family("meshd_plugin_events_total", "counter",
                   "The plugin host's counters (called, dropped, failed:<plugin>, ...).")
        for event, n in sorted(snap["plugin_stats"].items()):
            if _number(n) is not None:
                out.sample("meshd_plugin_events_total", n, {"event": event})


# -- the HTTP server ------------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    server_version = "meshd-prometheus/0.1"
    timeout = 10  # a client that stalls mid-request loses its thread after this long

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def _serve(self, send_body: bool) -> None:
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_error(404, "Not Found", "meshd-prometheus serves /metrics only")
            return
        try:
            body = self.server.exporter.render().encode("utf-8")
        except Exception:
            log.exception("rendering the metrics failed")
            self.send_error(500, "Internal Server Error")
            return
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], exporter: Exporter) -> None:
        self.exporter = exporter
        super().__init__(address, _Handler)


class Exporter:
    """The HTTP endpoint and the node it reads; one per daemon process."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._node: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.snapshot_fallbacks = 0
        self.address: tuple[str, int] | None = None

    # -- configuration

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

    # -- lifecycle

    def start(self, node: Any, loop: asyncio.AbstractEventLoop | None) -> None:
        addr, port = self.configured_address()
        with self._lock:
            if self._server is not None:
                log.warning("meshd-prometheus already serves %s:%s in this process; not starting again",
                            *(self.address or ("?", "?")))
                return
            server_class: type[_Server] = _Server
            if ":" in addr:  # an IPv6 literal
                server_class = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
            try:
                server = server_class((addr, port), self)
            except OSError as exc:
                raise OSError(exc.errno, f"meshd-prometheus cannot listen on {addr}:{port} "
                                         f"({ADDR_ENV}/{PORT_ENV}): {exc.strerror or exc}") from exc
            self._node, self._loop, self._server = node, loop, server
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
            self._node = self._loop = None
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

    # -- scraping (HTTP threads)

    def _snapshot(self) -> dict[str, Any] | None:
        node, loop = self._node, self._loop
        if node is None:
            return None
        if loop is not None and not loop.is_closed():
            # The node's dicts belong to its loop: let the loop copy them, between two events.
            future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()

            def take() -> None:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(node_snapshot(node))
                    except BaseException as exc:
                        future.set_exception(exc)
            try:
                loop.call_soon_threadsafe(take)
                return future.result(SNAPSHOT_TIMEOUT)
            except Exception:
                future.cancel()
                log.debug("node snapshot in its loop failed; reading directly", exc_info=True)
                with self._lock:
                    self.snapshot_fallbacks += 1
        return node_snapshot(node)  # every read is guarded: a race loses that metric this scrape

    def render(self) -> str:
        out = _Writer()
        self.metrics.render(out)
        snap = self._snapshot()
        if snap:
            _render_node(snap, out)
        out.family("meshd_prometheus_snapshot_fallbacks_total", "counter",
                   "Scrapes that read the node directly because its event loop did not answer in time.")
        out.sample("meshd_prometheus_snapshot_fallbacks_total", self.snapshot_fallbacks)
        return out.text()


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"


METRICS = Metrics()
EXPORTER = Exporter(METRICS)


# -- lifecycle: in the daemon's event loop --------------------------------------------------------


@hookimpl
async def meshd_startup(node: Any) -> None:
    """Start the HTTP server. Binding and starting a thread are quick, but they are still done off
    the event loop, which the routing path shares. A bad address or a busy port raises: the daemon
    logs it, counts it as ``failed:prometheus`` and runs on without metrics."""
    loop = asyncio.get_running_loop()
    await asyncio.to_thread(EXPORTER.start, node, loop)


@hookimpl
async def meshd_shutdown(node: Any) -> None:
    """Stop the HTTP server (bounded: well within the daemon's hook timeout)."""
    await asyncio.to_thread(EXPORTER.stop, 3.0)


# -- observers and sinks: on meshd's plugin worker thread -----------------------------------------


@hookimpl
def meshd_collaboration(outcome: dict[str, Any]) -> None:
    """Count the outcome by kind and result; time it when it has a latency."""
    METRICS.collaboration(outcome)


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
