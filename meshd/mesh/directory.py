"""The agent directory: this node's agents, the agents peers host, and the topic index.

Owns: :class:`LocalAgent` records (by name and by connection routing id), the remote records
each peer last sent (by node id), which node hosts which remote name, the name-conflict rule
(:func:`loses_name`, on the registration counter: a Lamport clock, never a wall clock), the
directory version peers compare on heartbeats, the index of local
topic subscriptions (with their PUB/SUB keys), and applying a peer's full directory or a delta
of it (:meth:`Directory.apply_delta`). Every change to a local record is noted in ``journal``
(a :class:`~meshd.mesh.directory_updates.ChangeJournal`), from which
meshd/mesh/directory_updates.py builds the delta peers
get. It must not touch sockets, peers or plugins: it
returns what changed (a key to subscribe, the local agents that lost a name) and the node acts.
Peers and the directory never import each other; they meet only in node.py.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from meshd.mesh.directory_updates import ChangeJournal
from meshd.mesh.liveness import PeerState
from meshd.wire import protocol as P
from meshd.wire import topics as T
from meshd.wire.system_names import SYSTEM_PREFIX

MATCH_CACHE_MAX = 4096
"""Topics whose matching subscribers (local, remote) are cached; the cache empties past it."""

__all__ = ["MATCH_CACHE_MAX", "RECORD_OVERHEAD", "Directory", "LocalAgent", "loses_name", "record_reg",
           "topic_cost"]

RECORD_OVERHEAD = 256
"""Bytes an agent's ``dir`` record costs beyond its name, capabilities, metadata and topics (keys,
node id, state, times): the directory budget counts with it."""


def topic_cost(topic: str, durable: bool) -> int:
    """Bytes one subscription adds to its agent's ``dir`` record (listed again if durable)."""
    one = len(topic.encode()) + 3  # msgpack str header
    return 2 * one if durable else one


@dataclass(eq=False)
class LocalAgent:
    """An agent attached to this daemon over the local socket."""

    name: str
    rid: bytes
    capabilities: list[str]
    metadata: dict[str, Any]
    registered_at: float  # this node's wall clock, shown to people only; never compared
    topics: set[str] = field(default_factory=set)
    durable: set[str] = field(default_factory=set)  # topics whose qos-1 publications it must not miss
    last_seen: float = field(default_factory=time.monotonic)
    state: PeerState = PeerState.ONLINE
    telemetry: dict[str, Any] = field(default_factory=dict)
    #: Work messages this daemon wrote to it (its heartbeat's ``read`` says how many it read).
    work_sent: int = 0
    reg: int = 0  # the registration counter (Lamport): what name conflicts are decided on
    #: Contract records of its typed topics (docs/contracts.md), checked at registration.
    contracts: list[dict[str, Any]] = field(default_factory=list)
    #: Their digest: what a record change carries instead of them (``cver``).
    contracts_digest: str = ""

    def record(self, node_id: str) -> dict[str, Any]:
        rec = {
            "name": self.name,
            "node": node_id,
            "capabilities": self.capabilities,
            "metadata": self.metadata,
            "topics": sorted(self.topics),
            "durable": sorted(self.durable),
            "registered_at": self.registered_at,
            "reg": self.reg,
            "state": str(self.state),
            "telemetry": self.telemetry,
        }
        if self.contracts:
            rec["contracts"] = self.contracts
            rec["cver"] = self.contracts_digest
        return rec

    def durable_for(self, topic: str) -> bool:
        """Is ``topic`` (a publication's) durable for this agent: exactly or by a pattern?"""
        durable = self.durable
        return topic in durable or any(T.is_pattern(p) and T.matches(T.split(p), topic) for p in durable)


def record_reg(rec: Mapping[str, Any]) -> int | None:
    """A record's registration counter; None if it has none that is a non-negative integer."""
    reg = rec.get("reg")
    return reg if type(reg) is int and reg >= 0 else None


def loses_name(mine: LocalAgent, own_node_id: str, theirs: Mapping[str, Any]) -> bool:
    """Two nodes accepted one name (a partition, or at the same moment): the smaller
    (registration counter, node id) keeps it, the same decision on every node.

    The counter is a Lamport clock (:meth:`Directory.next_reg`), so a registration that a node
    made after it knew of the other one always loses; no wall clock takes part. A record with no
    usable counter never wins (it cannot be ordered).
    """
    their_reg = record_reg(theirs)
    if their_reg is None:
        return False
    return (their_reg, str(theirs.get("node"))) < (mine.reg, own_node_id)


def _valid_change(ch: Any, held: Mapping[str, Any]) -> bool:
    """Whether one entry of a delta's ``changes`` is well formed and applies to ``held``."""
    if not isinstance(ch, dict) or not P.valid_name(ch.get("name")):
        return False
    if ch.get("gone") is True:
        return True
    if "rec" in ch:
        rec = ch["rec"]
        return isinstance(rec, dict) and rec.get("name") == ch["name"]
    if ch["name"] not in held or ("set" in ch and not isinstance(ch["set"], dict)):
        return False
    return all(isinstance(ch.get(k, []), list) and all(isinstance(t, str) for t in ch.get(k, []))
               for k in ("sub", "dsub", "unsub"))


def _holder_keeps(holder_node: str, holder_rec: Mapping[str, Any], node: str,
                  rec: Mapping[str, Any]) -> bool:
    """Between two remote holders of one name, the smaller (counter, node id) keeps it."""
    rec_reg = record_reg(rec)
    if rec_reg is None:
        return True
    holder_reg = record_reg(holder_rec)
    return holder_reg is not None and (holder_reg, holder_node) < (rec_reg, node)


_NOBODY: frozenset[LocalAgent] = frozenset()


def _subscribes(topics: Any, topic: str) -> bool:
    """Does a remote record's ``topics`` (or ``durable``) list take a publication on ``topic``?"""
    if not topics or not isinstance(topics, list):
        return False
    return topic in topics or any(isinstance(t, str) and T.is_pattern(t) and T.matches(T.split(t), topic)
                                  for t in topics)


class Directory:
    """Local and remote agents of the mesh as this node knows them."""

    def __init__(self, node_id: str = "", *, journal_max_bytes: int = 512 * 1024) -> None:
        self.node_id = node_id
        #: Bumped on every local change; peers resync when a heartbeat shows another version.
        self.version = 0
        #: The version peers were last told of (heartbeats carry it; the next delta starts there).
        self.announced = 0
        #: What changed in the local records since ``announced`` (meshd/mesh/directory_updates.py).
        self.journal = ChangeJournal(journal_max_bytes)
        #: (node id, agent name) -> its remote record's topics and durable topics as sets, kept
        #: while deltas change that record (so applying one costs the change, not the record).
        self._topic_sets: dict[tuple[str, str], tuple[set[str], set[str]]] = {}
        self.local: dict[str, LocalAgent] = {}
        self.local_by_rid: dict[bytes, LocalAgent] = {}
        #: Remote agent name -> node id of the peer hosting it.
        self.remote: dict[str, str] = {}
        #: Node id -> {agent name -> record} as that peer last sent it.
        self.remote_agents: dict[str, dict[str, dict[str, Any]]] = {}
        self.local_topics: dict[str, set[LocalAgent]] = {}
        #: PUB/SUB key -> local subscribers (what a publication arriving from a peer is for).
        self.local_topic_keys: dict[bytes, set[LocalAgent]] = {}
        self._remote_topic_counts: Counter[str] | None = None
        #: How many remote subscriptions are patterns (counted with ``_remote_topic_counts``).
        self._remote_patterns = 0
        #: Topic -> how many remote agents subscribe to it, exactly or by a pattern (cached
        #: while some remote subscriptions are patterns; emptied when a remote record changes).
        self._remote_match: dict[str, int] = {}
        #: Local pattern -> (its tokens, its local subscribers); a pattern's SUB prefix key ->
        #: how many local patterns need it; topic -> every local subscriber, exact or pattern.
        self.local_patterns: dict[str, tuple[T.Pattern, set[LocalAgent]]] = {}
        self._prefix_refs: Counter[bytes] = Counter()
        self._local_match: dict[str, frozenset[LocalAgent]] = {}
        #: The registration Lamport clock: the largest counter seen here, in any record.
        self.reg_clock = 0
        #: Local agent name -> the bytes its record costs without telemetry (see ``record_cost``).
        self.record_bytes: dict[str, int] = {}
        #: What peers accept in one ``dir`` body; past it, records go without telemetry.
        self.body_limit = P.DEFAULT_MAX_PAYLOAD_BYTES - 64 * 1024

    # ------------------------------------------------------------------ this node's agents

    def body(self) -> dict[str, Any]:
        """The ``dir`` body peers receive (HELLO, SYNC answers, changes).

        Registrations and subscriptions are admitted against a budget (``directory_max_bytes``)
        that leaves out telemetry; should the telemetry push the body past ``body_limit``, the
        records go without it, so the body always fits what a peer accepts."""
        body: dict[str, Any] = {"version": self.version, "deltas": True,
                                "agents": [a.record(self.node_id) for a in self.local.values()]}
        if self.estimated_bytes() + 16 * 1024 * len(self.local) > self.body_limit and \
                len(P.pack(body)) > self.body_limit:
            for rec in body["agents"]:
                rec["telemetry"] = {}
        return body

    @staticmethod
    def record_cost(name: str, capabilities: list[str], metadata: dict[str, Any],
                    contracts: list[dict[str, Any]] | None = None) -> int:
        """Bytes a new agent's record costs without topics and telemetry."""
        return RECORD_OVERHEAD + len(P.pack([name, capabilities, metadata])) + \
            (len(P.pack(contracts)) + 32 if contracts else 0)

    def estimated_bytes(self) -> int:
        """What this node's ``dir`` body costs without telemetry (an upper estimate)."""
        return sum(self.record_bytes.values())

    def next_reg(self) -> int:
        """The counter for a registration now: one more than any this node has seen."""
        self.reg_clock += 1
        return self.reg_clock

    def bump(self) -> int:
        self.version += 1
        return self.version

    def add_local(self, agent: LocalAgent) -> None:
        self.local[agent.name] = agent
        self.local_by_rid[agent.rid] = agent
        self.recount(agent)
        self.journal.whole(agent.name)

    def recount(self, agent: LocalAgent) -> None:
        """Recompute what ``agent``'s record costs (after it registered or re-registered)."""
        self.journal.fields(agent.name)
        self.record_bytes[agent.name] = self.record_cost(agent.name, agent.capabilities, agent.metadata,
                                                         agent.contracts) + \
            sum(topic_cost(t, t in agent.durable) for t in agent.topics)

    def remove_local(self, agent: LocalAgent) -> list[bytes] | None:
        """Forget ``agent`` (and its subscriptions). None if it was not the current holder of its
        name; else the topic keys nobody here subscribes to any more (to unsubscribe on peers)."""
        if self.local.get(agent.name) is not agent:
            return None
        del self.local[agent.name]
        self.local_by_rid.pop(agent.rid, None)
        self.record_bytes.pop(agent.name, None)
        self.journal.whole(agent.name)
        dropped = []
        for topic in list(agent.topics):
            _, key = self.unsubscribe(agent, topic)
            if key is not None:
                dropped.append(key)
        return dropped

    def subscribe(self, agent: LocalAgent, topic: str, durable: bool = False) -> tuple[bool, bytes | None]:
        """Idempotent. Returns (the directory changed, the PUB/SUB key if it is the topic's first
        local subscriber: peers' SUB sockets must subscribe to it)."""
        changed = False
        if durable != (topic in agent.durable):
            if topic in agent.topics:
                self._charge(agent, topic_cost(topic, durable) - topic_cost(topic, not durable))
            if durable:
                agent.durable.add(topic)
            else:
                agent.durable.discard(topic)
            changed = topic in agent.topics
        if topic in agent.topics:
            if changed:
                self.journal.topic(agent.name, topic)
            return changed, None
        agent.topics.add(topic)
        self.journal.topic(agent.name, topic)
        self._charge(agent, topic_cost(topic, durable))
        self._local_match.clear()
        if T.is_pattern(topic):
            self.local_patterns.setdefault(topic, (T.split(topic), set()))[1].add(agent)
            key = T.prefix_key(topic)
            self._prefix_refs[key] += 1
            return True, key if self._prefix_refs[key] == 1 else None
        subs = self.local_topics.setdefault(topic, set())
        key = P.topic_key(topic)
        self.local_topic_keys[key] = subs
        first = not subs
        subs.add(agent)
        return True, key if first else None

    def unsubscribe(self, agent: LocalAgent, topic: str) -> tuple[bool, bytes | None]:
        """Idempotent. Returns (it was subscribed, the key nobody here subscribes to any more)."""
        if topic not in agent.topics:
            return False, None
        self._charge(agent, -topic_cost(topic, topic in agent.durable))
        agent.topics.discard(topic)
        agent.durable.discard(topic)
        self.journal.topic(agent.name, topic)
        self._local_match.clear()
        if T.is_pattern(topic):
            return True, self._drop_pattern(agent, topic)
        subs = self.local_topics.get(topic, set())
        subs.discard(agent)
        if subs:
            return True, None
        self.local_topics.pop(topic, None)
        key = P.topic_key(topic)
        self.local_topic_keys.pop(key, None)
        return True, key

    def _drop_pattern(self, agent: LocalAgent, topic: str) -> bytes | None:
        """``agent`` no longer subscribes to pattern ``topic``: the prefix key nobody here needs
        any more, or None."""
        entry = self.local_patterns.get(topic)
        if entry is not None:
            entry[1].discard(agent)
            if not entry[1]:
                del self.local_patterns[topic]
        key = T.prefix_key(topic)
        self._prefix_refs[key] -= 1
        if self._prefix_refs[key] > 0:
            return None
        del self._prefix_refs[key]
        return key

    def sub_keys(self) -> list[bytes]:
        """What this node's SUB sockets subscribe to on every peer: each exact topic's key and
        each pattern's literal prefix (meshd/wire/topics.py)."""
        return [*self.local_topic_keys, *self._prefix_refs]

    def local_subscribers(self, topic: str) -> frozenset[LocalAgent] | set[LocalAgent]:
        """Every local agent a publication on ``topic`` is for: exact subscribers and those with
        a matching pattern, each once (however many of its patterns match)."""
        exact = self.local_topics.get(topic)
        if not self.local_patterns:
            return exact if exact is not None else _NOBODY
        hit = self._local_match.get(topic)
        if hit is None:
            found = set(exact) if exact is not None else set()
            for pattern, subs in self.local_patterns.values():
                if T.matches(pattern, topic):
                    found |= subs
            if len(self._local_match) >= MATCH_CACHE_MAX:
                self._local_match.clear()
            hit = self._local_match[topic] = frozenset(found)
        return hit

    def subscribers_of_key(self, key: bytes) -> frozenset[LocalAgent] | set[LocalAgent] | None:
        """The local subscribers of a peer's publication, by its envelope frame (``topic\\0``)."""
        if not self.local_patterns:
            return self.local_topic_keys.get(key)
        if not key.endswith(b"\x00") or len(key) > 4 * P.MAX_TOPIC_LEN + 1:
            return None
        return self.local_subscribers(key[:-1].decode("utf-8", "replace")) or None

    def _charge(self, agent: LocalAgent, nbytes: int) -> None:
        if agent.name in self.record_bytes and self.local.get(agent.name) is agent:
            self.record_bytes[agent.name] += nbytes

    # ------------------------------------------------------------------ peers' agents

    def host_of(self, name: str) -> str | None:
        """The node id of the peer hosting remote agent ``name``."""
        return self.remote.get(name)

    def records_of(self, node_id: str) -> dict[str, dict[str, Any]]:
        return self.remote_agents.get(node_id, {})

    def remote_count(self) -> int:
        """Remote agents, not counting the daemons' system agents (``meshd.sys.``)."""
        return sum(1 for agents in self.remote_agents.values() for name in agents
                   if not name.startswith(SYSTEM_PREFIX))

    def own_count(self) -> int:
        """This node's agents, not counting its system agent."""
        return sum(1 for name in self.local if not name.startswith(SYSTEM_PREFIX))

    def drop_node(self, node_id: str) -> None:
        """A peer went offline, restarted or was cut off: its agents leave the directory."""
        agents = self.remote_agents.pop(node_id, {})
        for name in agents:
            if self.remote.get(name) == node_id:
                del self.remote[name]
            self._topic_sets.pop((node_id, name), None)
        if agents:
            self._remote_changed()

    def apply_node(self, node_id: str, body: Any) -> tuple[int, list[LocalAgent]] | None:
        """Replace what peer ``node_id`` hosts with its ``dir`` body.

        Returns None for a body of the wrong shape (nothing changes), else (the peer's directory
        version, -1 if it sent none, and the local agents that lose their name to it: the caller
        evicts them). A remote name held by two peers goes to the smaller (counter, node id).
        """
        if not isinstance(body, dict) or not isinstance(body.get("agents"), list):
            return None
        version = body.get("version")
        agents: dict[str, dict[str, Any]] = {}
        for rec in body["agents"]:
            if isinstance(rec, dict) and P.valid_name(rec.get("name")):
                agents[rec["name"]] = rec
                reg = record_reg(rec)
                if reg is not None and reg > self.reg_clock:
                    self.reg_clock = reg  # Lamport: later registrations here order after it
        self.drop_node(node_id)
        self.remote_agents[node_id] = agents
        self._remote_changed()
        losers: list[LocalAgent] = []
        for name, rec in agents.items():
            self._admit(node_id, name, rec, losers)
        return (version if isinstance(version, int) else -1), losers

    def _admit(self, node_id: str, name: str, rec: Mapping[str, Any], losers: list[LocalAgent]) -> None:
        """Peer ``node_id`` holds ``name`` (record ``rec``): a local holder that loses the name
        joins ``losers``; the name routes to that peer unless another holder keeps it."""
        mine = self.local.get(name)
        if mine is not None and loses_name(mine, self.node_id, rec):
            losers.append(mine)
        holder = self.remote.get(name)
        if (holder is not None and holder != node_id
                and _holder_keeps(holder, self.records_of(holder).get(name, {}), node_id, rec)):
            return
        if name not in self.local or mine in losers:
            self.remote[name] = node_id

    def apply_delta(self, node_id: str, changes: Any) -> list[LocalAgent] | None:
        """Apply a delta's ``changes`` to what peer ``node_id`` hosts (docs/PROTOCOL.md §9.4).

        Returns None, changing nothing, if we hold no directory of that peer or a change is
        malformed or names a record we do not hold (the caller asks for the full directory);
        else the local agents that lose their name to it (the same rule as a full directory).
        """
        held = self.remote_agents.get(node_id)
        if held is None or not isinstance(changes, list) or not all(
                _valid_change(ch, held) for ch in changes):
            return None
        losers: list[LocalAgent] = []
        for ch in changes:
            name: str = ch["name"]
            if ch.get("gone") is True:
                if held.pop(name, None) is not None:
                    self._remote_changed()
                if self.remote.get(name) == node_id:
                    del self.remote[name]
                self._topic_sets.pop((node_id, name), None)
                continue
            rec = ch.get("rec")
            if rec is not None:
                held[name] = rec
                self._remote_changed()
                self._topic_sets.pop((node_id, name), None)
            else:
                old = held[name]
                rec = old
                if "set" in ch:
                    rec = held[name] = ch["set"] | {"name": name, "topics": old.get("topics") or [],
                                                    "durable": old.get("durable") or []}
                    if "contracts" in old and rec.get("cver") == old.get("cver"):
                        rec["contracts"] = old["contracts"]  # sent once, then named by version
                self._retopic(node_id, name, rec, ch)
            reg = record_reg(rec)
            if reg is not None and reg > self.reg_clock:
                self.reg_clock = reg
            self._admit(node_id, name, rec, losers)
        return losers

    def _retopic(self, node_id: str, name: str, rec: dict[str, Any], ch: Mapping[str, Any]) -> None:
        """Apply a change's ``sub``, ``dsub`` and ``unsub`` to remote record ``rec``."""
        if not any(k in ch for k in ("sub", "dsub", "unsub")):
            return
        sets = self._topic_sets.get((node_id, name))
        topics: list[str] = rec["topics"] if isinstance(rec.get("topics"), list) else []
        durable: list[str] = rec["durable"] if isinstance(rec.get("durable"), list) else []
        rec["topics"], rec["durable"] = topics, durable
        if sets is None:
            sets = self._topic_sets[(node_id, name)] = (set(topics), set(durable))
        in_topics, in_durable = sets
        self._remote_match.clear()
        counts = self._remote_topic_counts
        for topic in ch.get("unsub", ()):
            if topic in in_topics:
                in_topics.discard(topic)
                topics.remove(topic)
                if counts is not None:
                    counts[topic] -= 1
                    self._remote_patterns -= T.is_pattern(topic)
            if topic in in_durable:
                in_durable.discard(topic)
                durable.remove(topic)
        added = [(t, False) for t in ch.get("sub", ())] + [(t, True) for t in ch.get("dsub", ())]
        for topic, make_durable in added:
            if topic not in in_topics:
                in_topics.add(topic)
                topics.append(topic)
                if counts is not None:
                    counts[topic] += 1
                    self._remote_patterns += T.is_pattern(topic)
            if make_durable and topic not in in_durable:
                in_durable.add(topic)
                durable.append(topic)
            elif not make_durable and topic in in_durable:
                in_durable.discard(topic)
                durable.remove(topic)

    # ------------------------------------------------------------------ topics

    def _remote_changed(self) -> None:
        self._remote_topic_counts = None
        self._remote_match.clear()

    def remote_subscribers(self, topic: str) -> int:
        """How many remote agents subscribe to ``topic``, exactly or by a pattern, each agent
        once (cached until a directory changes)."""
        counts = self._remote_topic_counts
        if counts is None:
            counts = Counter()
            patterns = 0
            for agents in self.remote_agents.values():
                for rec in agents.values():
                    for t in rec.get("topics") or ():
                        if isinstance(t, str):
                            counts[t] += 1
                            if T.is_pattern(t):
                                patterns += 1
            self._remote_topic_counts = counts
            self._remote_patterns = patterns
            self._remote_match.clear()
        if not self._remote_patterns:
            return counts.get(topic, 0)
        hit = self._remote_match.get(topic)
        if hit is None:
            hit = sum(1 for agents in self.remote_agents.values() for rec in agents.values()
                      if _subscribes(rec.get("topics"), topic))
            if len(self._remote_match) >= MATCH_CACHE_MAX:
                self._remote_match.clear()
            self._remote_match[topic] = hit
        return hit

    def durable_subscribers(self, topic: str) -> list[str]:
        """Names (local and remote) with a durable subscription to ``topic``, exactly or by a
        pattern, each once."""
        names = [a.name for a in self.local.values() if a.durable and a.durable_for(topic)]
        for agents in self.remote_agents.values():
            names.extend(n for n, rec in agents.items() if _subscribes(rec.get("durable"), topic))
        return names

    def local_agents(self) -> Iterable[LocalAgent]:
        return self.local.values()
