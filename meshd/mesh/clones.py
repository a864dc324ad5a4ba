"""Duplicate node ids (cloned images): one node id answered by two live daemons.

Every daemon start has a fresh random boot id (``incarnation`` in HELLO). A restart replaces
the boot id for good; two machines sharing one state dir (an SD-card image cloned after first
boot) make the boot ids of one node id alternate, because each connection of one clone hands
the routing id over from the other (ROUTER_HANDOVER) and greets again. So a boot id that comes
*back* after another one, within ``window`` seconds, is a duplicate. :class:`DuplicateIds` keeps
the recent boot ids per node id and where they were reached, and the duplicates found, here or
reported by peers in their HELLO (``dups``).

:class:`CloneWatch` adds this node's own case (a peer reports a duplicate of *our* id, or a
daemon with our id greets us) and logs every finding loudly, once, with the fix.

Owns: those records (bounded by ``max_nodes``; the oldest node id is forgotten first) and the
duplicate-id log lines. It must not touch sockets or peer states: peers.py feeds it and greets.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CloneWatch", "DuplicateIds", "Sighting"]

log = logging.getLogger("meshd.node")

FIX = ("On the clone run `meshd reset-identity` (or restart it once with `meshd run --regenerate-id`); "
       "see docs/operations.md")

#: Boot ids remembered per node id (a flapping pair needs two).
_PER_NODE = 4


@dataclass
class Sighting:
    """One boot id of a node id: where it said it listens, and when we last heard it (monotonic)."""

    incarnation: str
    routers: list[str]
    last: float


def _routers(value: Any) -> list[str]:
    """A peer-supplied endpoint list, made safe: at most 8 strings, anything else dropped."""
    return [r for r in value[:8] if isinstance(r, str)] if isinstance(value, list) else []


@dataclass
class _Node:
    current: str = ""
    sightings: OrderedDict[str, Sighting] = field(default_factory=OrderedDict)


class DuplicateIds:
    """Recent boot ids per node id, and the node ids found duplicated."""

    def __init__(self, window: float, max_nodes: int = 256) -> None:
        self.window = window
        self.max_nodes = max_nodes
        self._nodes: OrderedDict[str, _Node] = OrderedDict()
        #: node id -> the boot ids and endpoints of the daemons sharing it.
        self.found: OrderedDict[str, list[Sighting]] = OrderedDict()
        self.forgotten = 0

    def saw(self, node_id: str, incarnation: str, routers: list[str], now: float) -> bool:
        """Record a HELLO of ``node_id`` with ``incarnation``; True when this reveals a duplicate
        not known before."""
        node = self._nodes.get(node_id)
        if node is None:
            node = self._nodes[node_id] = _Node()
            while len(self._nodes) > self.max_nodes:
                self._nodes.popitem(last=False)
                self.forgotten += 1
        self._nodes.move_to_end(node_id)
        earlier = node.sightings.get(incarnation)
        came_back = (earlier is not None and node.current not in ("", incarnation)
                     and now - node.sightings[node.current].last <= self.window
                     and now - earlier.last <= self.window)
        node.sightings[incarnation] = Sighting(incarnation, list(routers), now)
        node.sightings.move_to_end(incarnation)
        while len(node.sightings) > _PER_NODE:
            node.sightings.popitem(last=False)
        node.current = incarnation
        if not came_back:
            if node_id in self.found:
                self._merge(node_id, [node.sightings[incarnation]])
            return False
        live = [s for s in node.sightings.values() if now - s.last <= self.window]
        new = node_id not in self.found
        self._merge(node_id, live)
        return new

    def reported(self, node_id: str, entries: object, now: float) -> bool:
        """A peer says ``node_id`` is duplicated (``entries``: its ``dups`` list); True if new here."""
        if not isinstance(entries, list):
            return False
        sightings = [Sighting(str(e.get("inc", ""))[:64], _routers(e.get("routers")), now)
                     for e in entries[:_PER_NODE] if isinstance(e, dict)]
        if len(sightings) < 2:
            return False
        new = node_id not in self.found
        self._merge(node_id, sightings)
        return new

    def _merge(self, node_id: str, sightings: list[Sighting]) -> None:
        known = {s.incarnation: s for s in self.found.get(node_id, [])}
        for s in sightings:
            known[s.incarnation] = s
        self.found[node_id] = list(known.values())[-_PER_NODE:]
        self.found.move_to_end(node_id)
        while len(self.found) > self.max_nodes:
            self.found.popitem(last=False)
            self.forgotten += 1

    def prune(self, now: float) -> None:
        """Forget a duplicate once at most one of its daemons was heard within ``window`` (fixed)."""
        for node_id, sightings in list(self.found.items()):
            if sum(1 for s in sightings if now - s.last <= self.window) < 2:
                del self.found[node_id]

    def is_duplicate(self, node_id: str) -> bool:
        return node_id in self.found

    def wire(self) -> dict[str, list[dict[str, Any]]]:
        """The ``dups`` field of our HELLO: every duplicate we know, for the clones and the mesh."""
        return {node_id: [{"inc": s.incarnation, "routers": s.routers} for s in sightings]
                for node_id, sightings in self.found.items()}

    def describe(self, node_id: str) -> list[dict[str, Any]]:
        return [{"boot_id": s.incarnation, "routers": s.routers} for s in self.found.get(node_id, [])]


class CloneWatch(DuplicateIds):
    """Duplicate node ids of peers and of this node, logged loudly once each."""

    def __init__(self, node_id: str, incarnation: str, window: float, max_nodes: int = 256) -> None:
        super().__init__(window, max_nodes)
        self.node_id = node_id
        self.incarnation = incarnation
        #: Other daemons answering as *this* node id: our state dir was cloned (or theirs).
        self.self_duplicate: list[dict[str, Any]] = []

    def saw(self, node_id: str, incarnation: str, routers: list[str], now: float) -> bool:
        new = super().saw(node_id, incarnation, routers, now)
        if new:
            where = "; ".join(f"boot id {d['boot_id']} at {', '.join(d['routers']) or '?'}"
                              for d in self.describe(node_id))
            log.error("DUPLICATE NODE ID %s: two live daemons answer as this one node (%s). A cloned "
                      "state dir? %s", node_id, where, FIX)
        return new

    def take_report(self, dups: Any, now: float) -> int:
        """A peer's HELLO field ``dups``: learn them (one may be us); how many are new here."""
        if not isinstance(dups, dict):
            return 0
        new = 0
        for node_id, entries in list(dups.items())[:self.max_nodes]:
            if not isinstance(node_id, str) or not isinstance(entries, list):
                continue
            if node_id == self.node_id:
                new += self.cloned([e for e in entries if isinstance(e, dict)], "a peer reports it")
            elif self.reported(node_id, entries, now):
                new += 1
                log.error("DUPLICATE NODE ID %s (reported by a peer): two machines run with one state "
                          "dir. %s", node_id, FIX)
        return new

    def cloned(self, entries: list[dict[str, Any]], how: str) -> bool:
        """Another daemon answers as this node id; True if that is news."""
        others = [{"boot_id": str(e.get("inc", ""))[:64], "routers": _routers(e.get("routers"))}
                  for e in entries[:_PER_NODE] if e.get("inc") != self.incarnation]
        if not others:
            return False
        new = not self.self_duplicate
        if new:
            log.error("DUPLICATE NODE ID: another machine runs as this node %s (boot id %s, at %s; %s). "
                      "This state dir was cloned from (or to) it. %s", self.node_id,
                      others[0]["boot_id"], ", ".join(others[0]["routers"]) or "?", how, FIX)
        self.self_duplicate = others
        return new
