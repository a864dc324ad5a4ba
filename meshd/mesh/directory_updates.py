"""Directory updates between daemons: deltas for each change, the full directory only to resync.

Owns: the :class:`ChangeJournal` (which local agents changed since peers were last told, and
how: coalesced per agent, bounded by ``directory_max_bytes``), the wire shape of a delta (a
``dir`` body with ``base``: docs/PROTOCOL.md §9.4), and :class:`DirectoryUpdates`, which sends
each round of changes to every greeted peer (a delta to the peers whose directory body said
``deltas: true``, the full directory to the others) and takes what peers send: a full directory
replaces what we held for that peer, a delta that starts from the version we hold (or one we
passed) is applied, and a delta from a version we cannot reach (one was lost) asks the peer for
the full directory (``sync``). The counters ``dir_full_sent``, ``dir_delta_sent``,
``dir_bytes_sent``, ``dir_delta_gap`` and ``dir_delta_skipped`` are in the node's stats.

It must not touch the records themselves (directory.py applies a delta and decides name
conflicts), sockets (it sends through the peer table) or agents (the node's ``evict`` callback
removes a local agent that lost its name).

Test hook: ``MESHD_TEST_DROP_DIR_DELTA=<agent name>`` makes the daemon ignore the first delta it
receives that changes that agent's record, as if the network had lost it (counted as
``dir_delta_dropped_by_test``); the version-gap rule must then repair the directory. Never set it
in production.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from meshd.mesh.liveness import PeerState
from meshd.wire import protocol as P
from meshd.wire.protocol import Kind

if TYPE_CHECKING:
    from meshd.mesh.directory import Directory, LocalAgent
    from meshd.mesh.peer_record import Peer

__all__ = ["ChangeJournal", "DirectoryUpdates", "DirectoryWire", "delta_window"]

SYNC_EVERY = 0.5
"""Seconds between two ``sync`` requests to one peer (heartbeats and gaps share the limit)."""


@dataclass
class _AgentChange:
    whole: bool = False  # registered, re-registered or removed: the whole record (or its absence)
    fields: bool = False  # state, capabilities or metadata changed
    topics: set[str] = field(default_factory=set)  # topics (un)subscribed or made (non-)durable


class ChangeJournal:
    """What changed in this node's directory since peers were last told, coalesced per agent.

    Bounded: past ``max_bytes`` (about what the delta would take) it stops recording and reports
    ``overflow``; the next announcement then sends the full directory instead, so nothing is lost.
    """

    def __init__(self, max_bytes: int = 512 * 1024) -> None:
        self.max_bytes = max_bytes
        self.agents: dict[str, _AgentChange] = {}
        self.nbytes = 0
        self.overflow = False

    def __bool__(self) -> bool:
        return bool(self.agents) or self.overflow

    def _entry(self, name: str) -> _AgentChange | None:
        if self.overflow:
            return None
        entry = self.agents.get(name)
        if entry is None:
            self._grow(len(name) + 16)
            if not self.overflow:
                entry = self.agents[name] = _AgentChange()
        return entry

    def _grow(self, nbytes: int) -> None:
        self.nbytes += nbytes
        if self.nbytes > self.max_bytes:
            self.overflow = True
            self.agents.clear()

    def whole(self, name: str) -> None:
        """``name`` registered (again) or went away: its whole record (or its absence) goes."""
        entry = self._entry(name)
        if entry is not None:
            entry.whole, entry.fields = True, False
            entry.topics.clear()

    def fields(self, name: str) -> None:
        """Something in ``name``'s record other than its topics changed (state, metadata)."""
        entry = self._entry(name)
        if entry is not None and not entry.whole:
            entry.fields = True

    def topic(self, name: str, topic: str) -> None:
        """``name`` subscribed to ``topic``, unsubscribed, or changed its durability."""
        entry = self._entry(name)
        if entry is not None and not entry.whole and topic not in entry.topics:
            entry.topics.add(topic)
            self._grow(len(topic) + 4)

    def clear(self) -> None:
        self.agents.clear()
        self.nbytes = 0
        self.overflow = False

    def changes(self, directory: Directory) -> list[dict[str, Any]]:
        """The delta's ``changes``: the state now of everything that changed, one entry per agent."""
        out: list[dict[str, Any]] = []
        for name, entry in self.agents.items():
            agent = directory.local.get(name)
            if agent is None:
                out.append({"name": name, "gone": True})
            elif entry.whole:
                out.append({"name": name, "rec": agent.record(directory.node_id)})
            else:
                out.append(_partial(agent, entry, directory.node_id))
        return out


def _partial(agent: LocalAgent, entry: _AgentChange, node_id: str) -> dict[str, Any]:
    change: dict[str, Any] = {"name": agent.name}
    if entry.fields:
        rec = agent.record(node_id)
        del rec["topics"], rec["durable"]
        rec.pop("contracts", None)  # unchanged (a change sends the whole record): ``cver`` names them
        change["set"] = rec
    sub, dsub, unsub = [], [], []
    for topic in entry.topics:
        if topic not in agent.topics:
            unsub.append(topic)
        elif topic in agent.durable:
            dsub.append(topic)
        else:
            sub.append(topic)
    for key, topics in (("sub", sub), ("dsub", dsub), ("unsub", unsub)):
        if topics:
            change[key] = topics
    return change


def delta_window(known: int, body: dict[str, Any]) -> str | None:
    """Where a delta stands against the version ``known`` we hold of its sender: ``"apply"``
    (it starts at or before ``known`` and ends after it: it holds the state now of everything it
    names, so it applies to any version from its base on), ``"skip"`` (we already hold its
    version or a newer one), ``"gap"`` (it starts after what we hold: one was lost), or None
    (not a valid delta)."""
    base, version = body.get("base"), body.get("version")
    if type(base) is not int or type(version) is not int or not 0 <= base < version:
        return None
    if not isinstance(body.get("changes"), list):
        return None
    if known >= version:
        return "skip"
    return "apply" if 0 <= base <= known else "gap"


class DirectoryWire(Protocol):
    """What directory updates need of the peer table: its peers, a way to send to one, and
    whether the node is stopping (no announcements then)."""

    peers: dict[str, Peer]

    @property
    def stopping(self) -> bool: ...
    def send(self, peer: Peer, header: dict[str, Any], body: bytes = b"") -> bool: ...


class DirectoryUpdates:
    """Tells peers of this node's directory changes, and applies what peers tell it."""

    def __init__(self, directory: Directory, stats: Counter[str], *, peer_table: DirectoryWire,
                 evict: Callable[[LocalAgent, str], None]) -> None:
        """``evict``: called with a local agent that lost its name to a peer's record, and why."""
        self.directory = directory
        self.stats = stats
        self.journal = directory.journal
        self.peer_table = peer_table
        self.evict = evict
        #: Peers whose last full directory said they take deltas (``deltas: true``).
        self.delta_peers: set[str] = set()
        self._scheduled = False
        self._drop_for = os.environ.get("MESHD_TEST_DROP_DIR_DELTA", "")  # the test hook above

    # ------------------------------------------------------------------ sending

    def changed(self) -> None:
        """The directory changed (its version was bumped): tell peers once per loop turn,
        however many changes that turn made."""
        if self._scheduled:
            return
        self._scheduled = True
        try:
            asyncio.get_running_loop().call_soon(self.flush)
        except RuntimeError:  # no loop (unit tests): send now
            self.flush()

    def flush(self) -> None:
        """Send what changed since the last announcement to every greeted peer."""
        self._scheduled = False
        d = self.directory
        pt = self.peer_table
        if pt.stopping or (d.version == d.announced and not self.journal):
            return
        delta: bytes | None = None
        if not self.journal.overflow:
            delta = P.pack({"base": d.announced, "version": d.version,
                            "changes": self.journal.changes(d)})
            if len(delta) > d.body_limit or len(delta) >= d.estimated_bytes():
                delta = None  # as big as the whole directory: send that (it drops telemetry if need be)
        header = {P.KIND: Kind.DIRECTORY, P.FROM: d.node_id, P.VER: d.version}
        full: bytes | None = None
        for peer in pt.peers.values():
            if not peer.greeted or peer.state is PeerState.OFFLINE:
                continue
            if delta is not None and peer.node_id in self.delta_peers:
                body, counter = delta, "dir_delta_sent"
            else:
                full = full if full is not None else P.pack(d.body())
                body, counter = full, "dir_full_sent"
            if pt.send(peer, header, body):
                self.stats[counter] += 1
                self.stats["dir_bytes_sent"] += len(body)
        self.stats["directory_sent"] += 1
        d.announced = d.version
        self.journal.clear()

    def snapshot(self) -> dict[str, Any]:
        """The full directory for a HELLO or a ``sync`` answer (pending changes go out first, so
        the version it carries is the one heartbeats carry from now on)."""
        if self._scheduled or self.journal:
            self.flush()
        body = self.directory.body()
        self.stats["dir_full_sent"] += 1
        self.stats["dir_bytes_sent"] += len(P.pack(body))
        return body

    def announced_version(self) -> int:
        """The directory version peers were last told of (what heartbeats carry)."""
        return self.directory.announced

    # ------------------------------------------------------------------ receiving

    def received(self, peer: Peer, body: Any) -> None:
        """A peer's ``dir`` body (in a HELLO, a ``sync`` answer or after its changes)."""
        if isinstance(body, dict) and "base" in body:
            self._received_delta(peer, body)
            return
        applied = self.directory.apply_node(peer.node_id, body)
        if applied is None:
            self.stats["bad_directory"] += 1
            return
        peer.dir_version, losers = applied
        if body.get("deltas") is True:
            self.delta_peers.add(peer.node_id)
        else:
            self.delta_peers.discard(peer.node_id)
        if len(self.delta_peers) > len(self.peer_table.peers):
            self.delta_peers &= self.peer_table.peers.keys()
        self._evict(peer, losers)

    def _received_delta(self, peer: Peer, body: dict[str, Any]) -> None:
        if self._drop_for and any(isinstance(ch, dict) and ch.get("name") == self._drop_for
                                  for ch in body.get("changes") or ()):
            self._drop_for = ""
            self.stats["dir_delta_dropped_by_test"] += 1
            return
        where = delta_window(peer.dir_version, body)
        if where == "skip":
            self.stats["dir_delta_skipped"] += 1
            return
        applied = self.directory.apply_delta(peer.node_id, body["changes"]) if where == "apply" else None
        if applied is None:
            # A gap (a delta was lost) or a delta we cannot apply: ask for the whole directory.
            self.stats["dir_delta_gap" if where == "gap" else "bad_directory"] += 1
            self.ask_sync(peer)
            return
        peer.dir_version = body["version"]
        self._evict(peer, applied)

    def ask_sync(self, peer: Peer) -> None:
        """Ask ``peer`` for its full directory (at most once per ``SYNC_EVERY`` seconds)."""
        now = time.monotonic()
        if now - peer.last_sync_request <= SYNC_EVERY:
            return
        peer.last_sync_request = now
        self.peer_table.send(peer, {P.KIND: Kind.SYNC, P.FROM: self.directory.node_id})

    def _evict(self, peer: Peer, losers: list[LocalAgent]) -> None:
        for mine in losers:
            self.evict(mine, f"name {mine.name!r} is registered on node {peer.node_id} too")
