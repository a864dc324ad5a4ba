"""Both-ways liveness and duplicate node ids, sans sockets, on a fake clock."""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from meshd.config.settings import Settings
from meshd.mesh.clones import CloneWatch, DuplicateIds
from meshd.mesh.liveness import PeerState
from meshd.mesh.peers import Peer, PeerEvents, PeerTable
from meshd.mesh.security import Security
from meshd.mesh.two_way import EchoClock
from meshd.util.logonce import LogOnce
from meshd.wire import protocol as P


def _table(tmp_path: Path, changes: list[tuple[str, str, str]]) -> PeerTable:
    settings = Settings(state_dir=tmp_path, insecure=True, heartbeat_interval=1.0, stale_after=3.0,
                        offline_after=10.0)

    def nothing(*_: Any) -> None:
        return None

    events = PeerEvents(
        state_changed=lambda peer, old, new: changes.append((peer.node_id, str(old), str(new))),
        directory=nothing, restarted=nothing, acks=nothing, nacks=nothing, reject=nothing,
        topic_message=nothing,
        topic_keys=list, directory_body=dict, directory_version=lambda: 0, telemetry=dict,
    )
    return PeerTable(settings, node_id="self", name="me", incarnation="i", security=Security(settings),
                     events=events, stats=Counter(), quiet=LogOnce(logging.getLogger("test")),
                     interfaces=["127.0.0.1"], max_frame=1 << 20)


def test_a_peer_heard_but_not_echoing_us_turns_one_way_then_online_again(tmp_path: Path) -> None:
    changes: list[tuple[str, str, str]] = []
    table = _table(tmp_path, changes)
    peer = Peer(node_id="p1", greeted=True, state=PeerState.ONLINE, last_seen=100.0)
    table.peers["p1"] = peer
    ours = table.echo.next(100.0)  # a heartbeat we sent at t=100
    table.echo.took(peer, {P.SEQ: 41, P.ECHO: ours}, 100.1)  # its beat echoes it
    assert peer.heard_seq == 41 and peer.confirmed_at == 100.1
    # We keep hearing it (its DEALER to us works) but its echo never moves on: it does not hear us.
    for t in (101.0, 102.0, 103.0, 104.0):
        table.echo.next(t)
        table.echo.took(peer, {P.SEQ: 42, P.ECHO: ours}, t)  # the same old echo is no progress
        peer.last_seen = t
        table.check_liveness(t)
    assert peer.state is PeerState.ONLINE  # within stale_after + one beat of the last progress
    peer.last_seen = 104.5
    table.check_liveness(104.5)
    assert peer.state is PeerState.ONE_WAY and changes[-1] == ("p1", "online", "one-way")
    assert table.online_count() == 0 and table.by_state()["one-way"] == 1
    # An echo of a newer beat of ours is progress: heard again (heard_from reads the real
    # monotonic clock), it is online.
    table.echo.took(peer, {P.SEQ: 43, P.ECHO: table.echo.seq}, time.monotonic())
    table.heard_from(peer)
    assert peer.state is PeerState.ONLINE and changes[-1] == ("p1", "one-way", "online")


def test_a_congested_link_is_not_one_way(tmp_path: Path) -> None:
    """Our DEALER to the peer is connected but full (a flood): its echoes lag; that is congestion."""
    table = _table(tmp_path, [])
    peer = Peer(node_id="p1", greeted=True, state=PeerState.ONLINE, last_seen=100.0, echoes=True,
                confirmed_at=100.0, link_up=True, congested_at=103.8)
    table.peers["p1"] = peer
    peer.last_seen = 104.5
    table.check_liveness(104.5)
    assert peer.state is PeerState.ONLINE
    peer.link_up = False  # the connection dropped: no excuse left
    table.check_liveness(104.6)
    assert peer.state is PeerState.ONE_WAY


def test_the_header_echoes_the_last_seq_heard_and_numbers_increase() -> None:
    clock = EchoClock(keep=2, start=10)
    peer = Peer(node_id="p")
    first = clock.header(P.Kind.HEARTBEAT, "me", peer, 1.0)
    assert first[P.SEQ] == 11 and P.ECHO not in first
    clock.took(peer, {P.SEQ: 5}, 1.5)
    second = clock.header(P.Kind.HELLO, "me", peer, 2.0)
    assert second[P.SEQ] == 12 and second[P.ECHO] == 5
    clock.next(3.0)
    assert clock.sent_at(11) is None  # bounded: only the last `keep` send times are kept
    assert clock.sent_at(12) == 2.0 and clock.sent_at("12") is None
    clock.took(peer, {P.ECHO: 99}, 4.0)  # not a number we sent: no progress
    assert peer.confirmed_at == 0.0 and peer.last_echo == -1


def test_a_peer_that_sends_no_seq_is_online_when_heard(tmp_path: Path) -> None:
    table = _table(tmp_path, [])
    peer = Peer(node_id="old", greeted=True, state=PeerState.ONLINE, last_seen=100.0)
    table.peers["old"] = peer
    table.echo.took(peer, {P.VER: 3}, 100.0)  # a heartbeat of a meshd without both-ways liveness
    table.check_liveness(102.0)
    assert peer.state is PeerState.ONLINE and not peer.echoes


def test_a_restart_is_not_a_duplicate_but_a_boot_id_coming_back_is() -> None:
    ids = DuplicateIds(window=30.0)
    assert not ids.saw("n1", "boot-a", ["tcp://10.0.0.1:1"], 0.0)
    assert not ids.saw("n1", "boot-b", ["tcp://10.0.0.1:2"], 5.0)  # restarted: a new boot id
    assert not ids.is_duplicate("n1")
    assert not ids.saw("n2", "x", ["tcp://10.0.0.2:1"], 0.0)
    assert not ids.saw("n2", "y", ["tcp://10.0.0.3:1"], 0.1)
    assert ids.saw("n2", "x", ["tcp://10.0.0.2:1"], 0.2)  # x is back: two live daemons
    assert not ids.saw("n2", "y", ["tcp://10.0.0.3:1"], 0.3)  # known already: reported once
    assert {d["boot_id"] for d in ids.describe("n2")} == {"x", "y"}
    assert set(ids.wire()) == {"n2"}
    ids.prune(100.0)  # only one of them was heard since: fixed
    assert not ids.is_duplicate("n2")


def test_clone_watch_learns_that_this_node_is_a_clone_from_a_peer_report(
        caplog: pytest.LogCaptureFixture) -> None:
    watch = CloneWatch("me", "boot-mine", window=30.0)
    assert watch.take_report({"me": [{"inc": "boot-mine", "routers": []}]}, 1.0) == 0
    with caplog.at_level(logging.ERROR, logger="meshd.node"):
        report = {"me": [{"inc": "boot-mine", "routers": ["tcp://a:1"]},
                         {"inc": "boot-other", "routers": ["tcp://b:1"]}],
                  "n9": [{"inc": "p", "routers": []}, {"inc": "q", "routers": []}], 7: "garbage"}
        assert watch.take_report(report, 1.0) == 2
    assert watch.self_duplicate == [{"boot_id": "boot-other", "routers": ["tcp://b:1"]}]
    assert watch.is_duplicate("n9")
    assert "DUPLICATE NODE ID" in caplog.text and "meshd reset-identity" in caplog.text


def test_tables_of_duplicates_are_bounded() -> None:
    ids = DuplicateIds(window=30.0, max_nodes=2)
    for i in range(4):
        ids.reported(f"n{i}", [{"inc": "a"}, {"inc": "b"}], 0.0)
    assert list(ids.found) == ["n2", "n3"] and ids.forgotten == 2


def test_hostile_dups_in_a_hello_are_bounded_and_never_raise() -> None:
    watch = CloneWatch("me", "boot-mine", window=30.0, max_nodes=4)
    garbage: dict[Any, Any] = {
        "me": [{"inc": 5, "routers": 7}, {"inc": "x" * 500, "routers": ["tcp://a:1", 3, None]}],
        "n1": [{"inc": "a", "routers": "tcp://b:1"}, {"inc": "b"}, "junk", 9],
        "n2": "not a list", 3: [], "n3": [{"inc": "only-one"}],
    }
    watch.take_report(garbage, 1.0)
    assert watch.take_report(["not", "a", "map"], 1.0) == 0
    assert all(len(d["boot_id"]) <= 64 and all(isinstance(r, str) for r in d["routers"])
               for d in watch.self_duplicate)
    assert watch.is_duplicate("n1") and not watch.is_duplicate("n3")
    assert watch.describe("n1")[0]["routers"] == []
