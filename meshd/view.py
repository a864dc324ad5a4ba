"""What plugins (and the gateway, tools and metrics) may read of a running node: :class:`NodeView`.

Plugins get this documented, typed face of the node, never the node's internals (datasette's
``internals.rst`` rule): attribute names of the parts behind it may change between releases, this
Protocol does not without a note in docs/plugins.md.

Thread safety: ``metrics_snapshot()`` may be called from any thread (the plugin worker thread, an
HTTP exporter's thread). It returns an immutable :class:`MetricsSnapshot` that the node rebuilds on
its own loop, so a reader never sees a table half-updated. The other methods read live state and
must be called on the node's event loop (for example from a hook running there, or through
``loop.call_soon_threadsafe``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["LatencyReading", "MetricsSnapshot", "NodeView"]


@dataclass(frozen=True)
class LatencyReading:
    """One collaboration kind's latency histogram: non-cumulative counts per bucket (the last is
    +Inf), their sum in seconds, and the most recent observations (seconds, oldest first)."""

    buckets_s: tuple[float, ...]
    counts: tuple[int, ...]
    sum_s: float
    recent_s: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """One consistent reading of a node's counters and gauges (all plain values, safe to keep)."""

    node_id: str
    name: str
    mesh: str
    #: Seconds since the node started (its own monotonic clock).
    uptime_s: float
    #: Peers by state: ``{"online": 2, "stale": 0, "offline": 1}``.
    peers_by_state: Mapping[str, int] = field(default_factory=dict)
    #: This node's own agents by state (``online``, ``stale``).
    local_agents_by_state: Mapping[str, int] = field(default_factory=dict)
    #: Latest telemetry per local agent name: ``context_used_pct``, ``queue_depth``, ``tasks_summary``.
    agent_telemetry: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: qos-1 units staged and not yet acknowledged, and those sent and awaiting an ack.
    qos1_pending: int = 0
    qos1_in_flight: int = 0
    #: Each local agent's consumer lag: ``{agent: (messages waiting, age of the oldest in s)}``
    #: (meshd/delivery/consumer_lag.py), for agents whose heartbeat says what they read.
    agent_lag: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    #: qos-1 units in the outbox by destination agent (what waits for each receiver's ack).
    qos1_pending_by_dest: Mapping[str, int] = field(default_factory=dict)
    #: Dead letters recorded since start (the in-memory FIFO keeps only the newest).
    dead_letters_total: int = 0
    #: The node's message counters (``routed``, ``delivered``, ``bounced``, ``rejected``, ...).
    events: Mapping[str, int] = field(default_factory=dict)
    #: Observer events waiting for plugins, and the plugin host's counters.
    plugin_queue: int = 0
    plugin_stats: Mapping[str, int] = field(default_factory=dict)
    #: Time in each thread-mode plugin's hooks: ``{(plugin, hook): (calls, seconds, cpu_seconds)}``.
    plugin_hook_time: Mapping[tuple[str, str], tuple[int, float, float]] = field(default_factory=dict)
    #: Collaborations (send, request, delegate, handoff) by ``(kind, outcome)``, counted by the
    #: node itself, so that a metrics plugin need not receive every outcome (meshd_collaboration).
    collaborations: Mapping[tuple[str, str], int] = field(default_factory=dict)
    #: Those that ended in an error, by ``(kind, error code)`` (bounded: past 64 codes, "other").
    collaboration_errors: Mapping[tuple[str, str], int] = field(default_factory=dict)
    #: Messages this node's agents sent, by ``(kind, topic)``; topics past ``metrics_topic_labels``
    #: are counted under "other", a batch to one agent under "(batch)".
    messages: Mapping[tuple[str, str], int] = field(default_factory=dict)
    #: Request (and qos-1 send) latency by kind.
    latency: Mapping[str, LatencyReading] = field(default_factory=dict)


@runtime_checkable
class NodeView(Protocol):
    """The read-only face of a running node that plugins receive in ``meshd_startup``."""

    @property
    def node_id(self) -> str:
        """This node's persistent id (``state_dir/node_id``)."""
        ...

    @property
    def name(self) -> str:
        """This node's human name (defaults to the host name)."""
        ...

    @property
    def mesh(self) -> str:
        """The mesh name this node joined."""
        ...

    def metrics_snapshot(self) -> MetricsSnapshot:
        """The latest consistent reading of counters and gauges. Thread-safe."""
        ...

    def info(self) -> dict[str, Any]:
        """What ``meshctl node`` prints: identity, endpoints, counters. Call on the node's loop."""
        ...

    def agents(self) -> list[dict[str, Any]]:
        """Every agent in the mesh directory as ``meshctl agents`` lists it. Call on the node's loop."""
        ...

    def peers(self) -> list[dict[str, Any]]:
        """Every known peer as ``meshctl peers`` lists it. Call on the node's loop."""
        ...

    def dead_letters(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest ``limit`` dead letters the node keeps, oldest first, as
        ``meshctl deadletters list`` shows them: ``seq``, ``at``, ``reason``, ``detail``,
        ``attempts``, ``kind``, ``from``, ``to``, ``topic``, ``header``, ``bytes``. Call on the
        node's loop."""
        ...
