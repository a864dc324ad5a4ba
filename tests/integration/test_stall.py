"""A daemon that stalls for less than ``stale_after`` keeps its connections (default settings).

A GC pause, a busy edge CPU or a VM steal freezes a daemon for a second or two. Before, the ZMTP
heartbeat timeout (1 s, fixed in transport.py) cut every connection of a daemon stopped for
1.2 s and it went stale everywhere, although ``stale_after`` is 3 s. Now the ZMTP heartbeats
follow the settings (transport.zmtp_heartbeat_for): no connection is cut before ``stale_after``.

With the default 1 s heartbeat, the peer's silence is the stall plus up to one heartbeat
interval, so a stall up to ``stale_after - heartbeat_interval`` (2 s) changes no state, and a
longer one shorter than ``stale_after`` may show the peer stale for a moment, but cuts nothing and
never takes it offline. The stall is a SIGSTOP of the daemon's process.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from meshd.testing import MeshdFactory, MeshdProcess, wait_until


def counters(proc: MeshdProcess) -> dict[str, int]:
    stats: dict[str, Any] = proc.query("node")["stats"]
    return {k: int(stats.get(k, 0)) for k in ("peer_connection_dropped", "peer_stale", "peer_offline")}


def heard_within(proc: MeshdProcess, other: MeshdProcess, seconds: float) -> bool:
    peer = next((p for p in proc.query("peers") if p["node"] == other.node_id), None)
    return peer is not None and peer["state"] == "online" and (peer["last_seen_ago"] or 99) < seconds


@pytest.mark.parametrize("stall_s", [1.5, 2.5])
def test_a_stall_shorter_than_stale_after_cuts_no_connection(meshd_factory: MeshdFactory,
                                                             stall_s: float) -> None:
    a = meshd_factory.spawn("a", fast=False)  # heartbeat 1 s, stale after 3 s, offline after 10 s
    b = meshd_factory.spawn("b", fast=False)
    meshd_factory.wait_mesh([a, b])
    before_a, before_b = counters(a), counters(b)
    os.kill(b.pid, signal.SIGSTOP)
    try:
        time.sleep(stall_s)  # the fault itself: how long b is frozen
    finally:
        os.kill(b.pid, signal.SIGCONT)
    wait_until(lambda: heard_within(a, b, 0.9) and heard_within(b, a, 0.9), timeout=10,
               what="both hear each other again")
    # A cut would come at the ZMTP timeout (3 s) after the last PING: watch past it.
    time.sleep(max(0.0, 3.5 - stall_s))
    after_a, after_b = counters(a), counters(b)
    assert after_a["peer_connection_dropped"] == before_a["peer_connection_dropped"], (before_a, after_a)
    assert after_b["peer_connection_dropped"] == before_b["peer_connection_dropped"], (before_b, after_b)
    assert after_a["peer_offline"] == before_a["peer_offline"], (before_a, after_a)
    assert after_b["peer_offline"] == before_b["peer_offline"], (before_b, after_b)
    if stall_s <= 2.0:  # stall + one heartbeat interval < stale_after: no state change at all
        assert after_a["peer_stale"] == before_a["peer_stale"], (before_a, after_a)
        assert after_b["peer_stale"] == before_b["peer_stale"], (before_b, after_b)
    else:
        print(f"stall {stall_s} s: stale blips at a {after_a['peer_stale'] - before_a['peer_stale']}, "
              f"at b {after_b['peer_stale'] - before_b['peer_stale']}")
