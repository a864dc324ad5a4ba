"""Directory deltas alone (no sockets): the change journal, applying a delta, the version window."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from meshd.mesh.directory import Directory, LocalAgent
from meshd.mesh.directory_updates import ChangeJournal, DirectoryUpdates, delta_window
from meshd.mesh.liveness import PeerState
from meshd.mesh.peers import Peer
from meshd.wire import protocol as P


def _agent(name: str, reg: int = 1, rid: bytes = b"") -> LocalAgent:
    return LocalAgent(name=name, rid=rid or name.encode(), capabilities=[], metadata={},
                      registered_at=0.0, reg=reg)


def _delta(sender: Directory) -> dict[str, Any]:
    """What meshd/mesh/directory_updates.py sends for the sender's journal, through msgpack and back."""
    body = {"base": sender.announced, "version": sender.version, "changes": sender.journal.changes(sender)}
    sender.announced = sender.version
    sender.journal.clear()
    out: dict[str, Any] = P.unpack_body(P.pack(body))
    return out


def _view(d: Directory, node: str) -> dict[str, tuple[Any, ...]]:
    return {name: (sorted(r.get("topics") or []), sorted(r.get("durable") or []), r.get("state"),
                   r.get("metadata"), r.get("reg"))
            for name, r in d.records_of(node).items()}


def test_the_journal_coalesces_changes_per_agent() -> None:
    d = Directory("aaaa")
    a = _agent("a")
    d.add_local(a)
    d.journal.clear()
    for _ in range(3):  # subscribe, unsubscribe, subscribe again: one entry for the topic
        d.subscribe(a, "news")
        d.unsubscribe(a, "news")
    d.subscribe(a, "news")
    d.subscribe(a, "log", durable=True)
    d.subscribe(a, "old")
    d.unsubscribe(a, "old")
    [change] = d.journal.changes(d)
    assert change == {"name": "a", "sub": ["news"], "dsub": ["log"], "unsub": ["old"]}
    b = _agent("b", rid=b"rb")
    d.add_local(b)
    d.subscribe(b, "news")  # registered in this round: the whole record goes, topics included
    assert d.remove_local(a) == [P.topic_key("log")]
    changes = {c["name"]: c for c in d.journal.changes(d)}
    assert changes["a"] == {"name": "a", "gone": True}
    assert changes["b"]["rec"]["topics"] == ["news"] and set(changes["b"]) == {"name", "rec"}


def test_the_journal_is_bounded_and_overflows_to_a_full_directory() -> None:
    j = ChangeJournal(max_bytes=1000)
    for i in range(100):
        j.topic("a", f"topic-{i:04d}")
    assert j.overflow and not j.agents and j  # nothing kept; the next round sends the whole directory
    j.clear()
    assert not j and j.nbytes == 0


def test_the_version_window() -> None:
    body = {"base": 5, "version": 8, "changes": []}
    assert delta_window(5, body) == "apply"
    assert delta_window(6, body) == "apply"  # a snapshot inside the window: the delta still applies
    assert delta_window(8, body) == "skip" and delta_window(9, body) == "skip"
    assert delta_window(4, body) == "gap" and delta_window(-1, body) == "gap"
    for bad in ({"base": 8, "version": 8, "changes": []}, {"base": "5", "version": 8, "changes": []},
                {"base": -1, "version": 8, "changes": []}, {"base": 5, "version": 8, "changes": {}},
                {"base": True, "version": 8, "changes": []}):
        assert delta_window(5, bad) is None


def test_deltas_give_the_receiver_what_a_full_directory_gives() -> None:
    """Random registrations, (un)subscriptions, durability and state changes on one node: after
    each round, the receiver that applied the deltas holds exactly what a full body gives."""
    rng = random.Random(17)
    sender, by_delta, by_full = Directory("aaaa"), Directory("zzzz"), Directory("yyyy")
    by_delta.apply_node("aaaa", sender.body())
    names = [f"agent{i}" for i in range(5)]
    topics = [f"t{i}" for i in range(30)]
    for _round in range(60):
        for _ in range(rng.randint(1, 40)):
            name = rng.choice(names)
            agent = sender.local.get(name)
            op = rng.random()
            if agent is None:
                sender.add_local(_agent(name, reg=sender.next_reg()))
            elif op < 0.05:
                sender.remove_local(agent)
            elif op < 0.1:
                agent.state = rng.choice(list(type(agent.state)))
                agent.metadata = {"n": rng.randint(0, 9)}
                sender.recount(agent)
            elif op < 0.6:
                sender.subscribe(agent, rng.choice(topics), durable=rng.random() < 0.3)
            else:
                sender.unsubscribe(agent, rng.choice(topics))
            sender.bump()
        assert by_delta.apply_delta("aaaa", _delta(sender)["changes"]) == []
        by_full.apply_node("aaaa", P.unpack_body(P.pack(sender.body())))
        assert _view(by_delta, "aaaa") == _view(by_full, "aaaa")
        for topic in topics:
            assert by_delta.remote_subscribers(topic) == by_full.remote_subscribers(topic)
            assert sorted(by_delta.durable_subscribers(topic)) == sorted(by_full.durable_subscribers(topic))


def test_a_delta_that_does_not_fit_changes_nothing() -> None:
    d = Directory("zzzz")
    assert d.apply_delta("aaaa", [{"name": "a", "sub": ["x"]}]) is None  # no directory of that peer yet
    d.apply_node("aaaa", {"version": 1, "agents": [{"name": "a", "node": "aaaa", "reg": 1, "topics": ["x"]}]})
    for bad in ([{"name": "ghost", "sub": ["y"]}],  # a record we do not hold
                [{"name": "a", "sub": ["y"]}, {"name": "bad name"}],
                [{"name": "a", "sub": "y"}], [{"name": "a", "rec": {"name": "b"}}], [{"name": "a", "set": 5}],
                ["junk"]):
        assert d.apply_delta("aaaa", bad) is None
    assert d.records_of("aaaa")["a"]["topics"] == ["x"] and d.remote_subscribers("y") == 0


def test_name_conflicts_on_deltas_follow_the_full_directory_rule() -> None:
    """The same (counter, node id) rule as a full directory: the earlier registration keeps it."""
    d = Directory("bbbb")
    mine = _agent("planner", reg=100)
    d.add_local(mine)
    d.apply_node("aaaa", {"version": 1, "agents": []})
    late = {"name": "planner", "node": "aaaa", "reg": 101}
    assert d.apply_delta("aaaa", [{"name": "planner", "rec": late}]) == []
    assert d.host_of("planner") is None  # ours is earlier: it stays local
    early = {"name": "planner", "node": "aaaa", "reg": 50}
    assert d.apply_delta("aaaa", [{"name": "planner", "rec": early}]) == [mine]
    assert d.host_of("planner") == "aaaa"
    d.apply_node("cccc", {"version": 1, "agents": [{"name": "w", "node": "cccc", "reg": 5}]})
    assert d.apply_delta("aaaa", [{"name": "w", "rec": {"name": "w", "node": "aaaa", "reg": 9}}]) == []
    assert d.host_of("w") == "cccc"  # two remote holders: the earlier keeps it
    assert d.apply_delta("aaaa", [{"name": "w", "gone": True}]) == []
    assert d.host_of("w") == "cccc" and "w" not in d.records_of("aaaa")
    d.apply_delta("aaaa", [{"name": "x", "rec": {"name": "x", "node": "aaaa", "reg": 400}}])
    assert d.next_reg() == 401  # the registration counter stays a Lamport clock on deltas


class _Wire:
    """Stands in for the peer table's sockets: what DirectoryUpdates sent, to whom."""

    def __init__(self, *peers: Peer) -> None:
        self.peers = {p.node_id: p for p in peers}
        self.stopping = False
        self.sent: list[tuple[str, str, Any]] = []

    def send(self, peer: Peer, header: dict[str, Any], body: bytes = b"") -> bool:
        self.sent.append((peer.node_id, header[P.KIND], P.unpack_body(body) if body else None))
        return True


def _updates(*peers: Peer) -> tuple[DirectoryUpdates, _Wire, Counter[str]]:
    stats: Counter[str] = Counter()
    wire = _Wire(*peers)
    updates = DirectoryUpdates(Directory("aaaa", journal_max_bytes=64 * 1024), stats, peer_table=wire,
                               evict=lambda agent, why: None)
    return updates, wire, stats


def _greeted(node_id: str) -> Peer:
    return Peer(node_id=node_id, greeted=True, state=PeerState.ONLINE)


def test_a_peer_that_takes_deltas_gets_them_and_an_older_one_full_directories() -> None:
    """Mixed versions: a daemon whose full body does not say ``deltas: true`` keeps getting full
    directories (it would not understand a delta); the other gets only what changed."""
    new, old = _greeted("nnnn"), _greeted("oooo")
    updates, wire, stats = _updates(new, old)
    updates.received(new, {"version": 0, "deltas": True, "agents": []})
    updates.received(old, {"version": 0, "agents": []})  # a daemon from before deltas
    d = updates.directory
    agent = _agent("a")
    d.add_local(agent)
    for i in range(20):
        d.subscribe(agent, f"topic-{i}")
    d.bump()
    updates.flush()
    d.subscribe(agent, "one-more")
    d.bump()
    updates.flush()
    updates.flush()  # nothing changed since: nothing sent
    to_new = [body for node, _, body in wire.sent if node == "nnnn"]
    to_old = [body for node, _, body in wire.sent if node == "oooo"]
    assert [c["name"] for c in to_new[0]["changes"]] == ["a"]  # registered: the whole record
    assert sorted(to_new[0]["changes"][0]["rec"]["topics"]) == sorted(f"topic-{i}" for i in range(20))
    assert to_new[1] == {"base": 1, "version": 2, "changes": [{"name": "a", "sub": ["one-more"]}]}
    assert all("agents" in b and "base" not in b for b in to_old) and len(to_old) == 2
    assert d.announced == 2 and stats["dir_delta_sent"] == 2 and stats["dir_full_sent"] == 2
    assert updates.announced_version() == 2


def test_the_receiver_applies_skips_or_resyncs_on_a_gap() -> None:
    peer = _greeted("pppp")
    updates, wire, stats = _updates(peer)
    updates.received(peer, {"version": 3, "deltas": True, "agents": [
        {"name": "s", "node": "pppp", "reg": 1, "topics": ["x"]}]})
    assert peer.dir_version == 3
    updates.received(peer, {"base": 3, "version": 4, "changes": [{"name": "s", "sub": ["y"]}]})
    assert peer.dir_version == 4 and updates.directory.remote_subscribers("y") == 1
    updates.received(peer, {"base": 2, "version": 4, "changes": [{"name": "s", "unsub": ["y"]}]})
    assert stats["dir_delta_skipped"] == 1 and updates.directory.remote_subscribers("y") == 1
    assert wire.sent == []
    updates.received(peer, {"base": 5, "version": 6, "changes": [{"name": "s", "unsub": ["y"]}]})  # 4->5 lost
    assert stats["dir_delta_gap"] == 1 and peer.dir_version == 4
    assert wire.sent == [("pppp", P.Kind.SYNC, None)]
    updates.received(peer, {"base": 6, "version": 7, "changes": []})  # behind: one sync per 0.5 s
    assert stats["dir_delta_gap"] == 2 and len(wire.sent) == 1
    updates.received(peer, {"version": 7, "deltas": True, "agents": []})  # the sync's answer
    assert peer.dir_version == 7 and updates.directory.host_of("s") is None


def test_more_changes_than_the_journal_holds_go_as_the_full_directory() -> None:
    peer = _greeted("nnnn")
    updates, wire, stats = _updates(peer)
    updates.received(peer, {"version": 0, "deltas": True, "agents": []})
    updates.journal.max_bytes = 2000
    d = updates.directory
    agent = _agent("a")
    d.add_local(agent)
    d.bump()
    updates.flush()
    for i in range(200):  # about 2,400 bytes of topics in one round
        d.subscribe(agent, f"topic-{i:04d}")
    assert updates.journal.overflow
    d.bump()
    updates.flush()
    [_first, (_node, kind, body)] = wire.sent
    assert kind == P.Kind.DIRECTORY and "base" not in body and len(body["agents"][0]["topics"]) == 200
    assert stats["dir_full_sent"] == 1 and stats["dir_delta_sent"] == 1 and not updates.journal


def test_contracts_go_once_and_a_later_field_change_names_them_by_digest() -> None:
    from meshd.wire.contracts import contracts_digest

    sender, receiver = Directory("aaaa"), Directory("bbbb")
    receiver.apply_node("aaaa", P.unpack_body(P.pack(sender.body())))
    contracts = [{"topic": "verify", "version": "1.2",
                  "accepts": {"type": "object", "description": "x" * 500}}]
    a = LocalAgent(name="typed", rid=b"t", capabilities=[], metadata={}, registered_at=0.0, reg=1,
                   contracts=contracts, contracts_digest=contracts_digest(contracts))
    sender.add_local(a)
    sender.bump()
    first = _delta(sender)
    assert first["changes"][0]["rec"]["contracts"] == contracts  # the whole record: sent once
    assert receiver.apply_delta("aaaa", first["changes"]) == []
    a.state = PeerState.STALE
    sender.journal.fields("typed")
    sender.bump()
    second = _delta(sender)
    assert "contracts" not in second["changes"][0]["set"]  # a field change: the digest only
    assert len(P.pack(second)) < 400 < len(P.pack(first))
    assert receiver.apply_delta("aaaa", second["changes"]) == []
    held = receiver.records_of("aaaa")["typed"]
    assert held["state"] == "stale" and held["contracts"] == contracts and held["cver"] == a.contracts_digest
    # the bound counts them: the record's cost grows with its contracts
    assert sender.record_bytes["typed"] > len(P.pack(contracts))
