"""The peer table's liveness alone: peers go stale, then offline, on a fake clock; no sockets."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

from meshd.config.settings import Settings
from meshd.mesh.liveness import PeerState
from meshd.mesh.peers import Peer, PeerEvents, PeerTable
from meshd.mesh.security import Security
from meshd.util.logonce import LogOnce


def _table(tmp_path: Path, changes: list[tuple[str, str, str]]) -> PeerTable:
    settings = Settings(state_dir=tmp_path, insecure=True, stale_after=3.0, offline_after=10.0)

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


def test_silent_peer_goes_stale_then_offline(tmp_path: Path) -> None:
    changes: list[tuple[str, str, str]] = []
    table = _table(tmp_path, changes)
    peer = Peer(node_id="p1", greeted=True, state=PeerState.ONLINE, last_seen=100.0)
    table.peers["p1"] = peer
    table.check_liveness(102.0)
    assert changes == []
    table.check_liveness(103.5)
    assert changes == [("p1", "online", "stale")]
    table.check_liveness(109.0)
    assert len(changes) == 1  # stale waits for offline
    table.check_liveness(110.5)
    assert changes[-1] == ("p1", "stale", "offline")
    assert not peer.greeted and peer.dir_version == -1  # it must greet again
    table.check_liveness(500.0)
    assert len(changes) == 2  # an offline, ungreeted peer is left alone


def test_traffic_brings_a_peer_back_and_counts_as_a_heartbeat(tmp_path: Path) -> None:
    changes: list[tuple[str, str, str]] = []
    table = _table(tmp_path, changes)
    peer = Peer(node_id="p1", greeted=True, state=PeerState.STALE, last_seen=0.0)
    table.peers["p1"] = peer
    table.heard_from(peer)
    assert peer.state is PeerState.ONLINE and changes == [("p1", "stale", "online")]
    assert table.by_state() == {"online": 1, "one-way": 0, "stale": 0, "offline": 0}
    assert table.online_count() == 1
    assert table.stats["peer_online"] == 1
