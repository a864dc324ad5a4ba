"""What the live page and the SSE streams show of the mesh, and where it comes from.

Owns: :class:`MeshInfo` (the read-only questions the gateway asks the node: directory, peers,
node info, dead letters; answered through the node's ``meshd.view.NodeView``),
:class:`OutcomeObserver` (a plugin on the node's plugin host, registered by :class:`OutcomeFeed`
only while a dashboard is open, through ``PluginHost.register`` / ``unregister``; its hook runs on
the plugin worker thread and hands each outcome to the loop), :class:`MeshWatch` (snapshots for
the dashboard and the agent/peer state changes sent to every stream) and the page itself
(static/index.html).
Must not touch: routing, sessions' requests, the token.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from meshd.hookspecs import hookimpl
from meshd.plugins.host import PluginHost
from meshd.view import NodeView

__all__ = ["MeshInfo", "MeshWatch", "OutcomeFeed", "OutcomeObserver", "page_html"]

RECENT_OUTCOMES = 50
HISTORY_SAMPLES = 150
"""Metric samples kept for the page's charts, from the gateway's start (one every
``HISTORY_EVERY`` watch ticks: five minutes at 2 s), whether or not a page is open."""
HISTORY_EVERY = 4
ROUTED_EVENTS = ("delivered", "forwarded", "published")
RECENT_DEAD_LETTERS = 20
DEAD_LETTERS_SHOWN = 1024  # GET /v1/deadletters: at most the default dead_letter_capacity
_LETTER_KEYS = ("seq", "at", "reason", "detail", "attempts", "kind", "from", "to", "topic")


class MeshInfo:
    """The node's read-only answers (its :class:`~meshd.view.NodeView`), called on its loop."""

    def __init__(self, node: NodeView) -> None:
        self.node = node

    def agents(self) -> list[dict[str, Any]]:
        return self.node.agents()

    def peers(self) -> list[dict[str, Any]]:
        return self.node.peers()

    def info(self) -> dict[str, Any]:
        return self.node.info()

    def dead_letters(self, limit: int = DEAD_LETTERS_SHOWN) -> list[dict[str, Any]]:
        """The newest ``limit`` dead letters, oldest first."""
        return [{key: d.get(key) for key in _LETTER_KEYS} for d in self.node.dead_letters(limit)]


class OutcomeObserver:
    """Plugin object: hands each collaboration outcome to the loop, for the dashboard."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_outcome: Callable[[dict[str, Any]], None]) -> None:
        self._loop = loop
        self._on_outcome = on_outcome

    @hookimpl
    def meshd_collaboration(self, outcome: dict[str, Any]) -> None:
        # Plugin worker thread: hand the outcome to the loop, never touch loop state here.
        self._loop.call_soon_threadsafe(self._on_outcome, dict(outcome))


class OutcomeFeed:
    """Registers the observer only while a dashboard is open.

    Outcome tracking costs the routing path something per message (the node builds each outcome
    and queues it for the plugin thread); a daemon nobody watches should not pay it. So the
    observer is registered on the node's plugin host (``PluginHost.register``) when the first
    dashboard stream opens and unregistered (``PluginHost.unregister``) when the last one closes;
    the host tells the node, whose outcome tracking follows whether any observer remains.
    """

    NAME = "meshd.gateway"

    def __init__(self, plugins: PluginHost | None, observer: OutcomeObserver) -> None:
        self.plugins = plugins
        self.observer = observer
        self.watchers = 0

    def opened(self) -> None:
        self.watchers += 1
        if self.watchers == 1 and self.plugins is not None:
            self.plugins.register(self.observer, name=self.NAME)

    def closed(self) -> None:
        self.watchers -= 1
        if self.watchers == 0 and self.plugins is not None:
            self.plugins.unregister(self.NAME)


def _agent_key(rec: dict[str, Any]) -> str:
    return f"{rec.get('name')}@{rec.get('node')}"


class MeshWatch:
    """Builds dashboard snapshots and notices agent and peer state changes anywhere in the mesh."""

    def __init__(self, mesh: MeshInfo) -> None:
        self.mesh = mesh
        self.outcomes: deque[dict[str, Any]] = deque(maxlen=RECENT_OUTCOMES)
        #: ``[at, messages routed so far, dead letters so far, qos-1 pending]`` samples for the charts.
        self.history: deque[list[float]] = deque(maxlen=HISTORY_SAMPLES)
        self._agents: dict[str, str] = {}
        self._peers: dict[str, str] = {}

    def add_outcome(self, outcome: dict[str, Any]) -> None:
        self.outcomes.append(outcome)

    def sample(self) -> None:
        """One chart sample from the node's counters (cheap: a few numbers)."""
        info = self.mesh.info()
        stats = info.get("stats") or {}
        routed = sum(int(stats.get(k, 0) or 0) for k in ROUTED_EVENTS)
        pending = (info.get("qos1") or {}).get("pending", 0)
        self.history.append([round(time.time(), 3), routed, int(info.get("dead_letters", 0) or 0),
                             int(pending or 0)])

    def changes(self) -> list[tuple[str, dict[str, Any]]]:
        """Agent and peer state changes since the last call, as (event name, data)."""
        out: list[tuple[str, dict[str, Any]]] = []
        agents = {_agent_key(a): a for a in self.mesh.agents()}
        seen = {k: str(a.get("state", "online")) for k, a in agents.items()}
        for key, state in seen.items():
            old = self._agents.get(key, "absent")
            if old != state:
                rec = agents[key]
                out.append(("agent_state", {"name": rec.get("name"), "node": rec.get("node"),
                                            "node_name": rec.get("node_name"), "old": old, "new": state}))
        for key, old in self._agents.items():
            if key not in seen:
                name, _, node = key.partition("@")
                out.append(("agent_state", {"name": name, "node": node, "old": old, "new": "absent"}))
        self._agents = seen
        peers = {str(p.get("node")): p for p in self.mesh.peers()}
        pseen = {k: str(p.get("state")) for k, p in peers.items()}
        for key, state in pseen.items():
            old = self._peers.get(key, "absent")
            if old != state:
                out.append(("peer_state", {"node": key, "name": peers[key].get("name"), "old": old,
                                           "new": state}))
        self._peers = pseen
        return out

    def snapshot(self, gateway_stats: dict[str, Any]) -> dict[str, Any]:
        info = self.mesh.info()
        agents = self.mesh.agents()
        peers = self.mesh.peers()
        nodes = [{"node": info.get("node"), "name": info.get("name"), "state": "self",
                  "address": ", ".join(info.get("routers") or []),
                  "agents": sorted(str(a.get("name")) for a in agents if a.get("node") == info.get("node"))}]
        for p in peers:
            hosted = sorted(str(a.get("name")) for a in agents if a.get("node") == p.get("node"))
            nodes.append({"node": p.get("node"), "name": p.get("name"), "state": p.get("state"),
                          "address": p.get("router"), "agents": hosted})
        rows = []
        for a in agents:
            meta = a.get("metadata") or {}
            tel = a.get("telemetry") or {}
            rows.append({"name": a.get("name"), "node_name": a.get("node_name"), "state": a.get("state"),
                         "model": meta.get("model"), "colour": meta.get("colour"),
                         "project": meta.get("project"), "via": meta.get("via", "zmq"),
                         "context_used_pct": tel.get("context_used_pct"),
                         "queue_depth": tel.get("queue_depth"), "tasks_summary": tel.get("tasks_summary")})
        return {
            "at": time.time(), "node": {"node": info.get("node"), "name": info.get("name"),
                                        "mesh": info.get("mesh")},
            "nodes": nodes, "agents": rows, "outcomes": list(self.outcomes)[::-1],
            "dead_letters": self.mesh.dead_letters(RECENT_DEAD_LETTERS)[::-1],
            "dead_letters_total": info.get("dead_letters", 0),
            "qos1": info.get("qos1", {}), "gateway": gateway_stats,
            "history": list(self.history),
        }


def page_html() -> bytes:
    """The dashboard page (one file, inline CSS and JS, nothing loaded from elsewhere)."""
    from importlib import resources  # at the first page view, not at start

    return resources.files("meshd.gateway").joinpath("static/index.html").read_bytes()
