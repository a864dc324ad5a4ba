"""What an idle mesh costs on the LAN, counted at the hosts' interfaces (netlab, default liveness).

Every pair of daemons holds four TCP connections. Each used to carry ZMTP PINGs from both ends
every second besides the mesh heartbeat: about 32 packets per second per peer at idle (53 with
the earlier 250 ms PINGs). Now only the connecting end pings, once per ``offline_after``, and the
mesh heartbeat alone says who is alive: about 5 per peer (bench/idle_lan.py prints the figures).
Packets are counted, not timed; the bound is loose enough for a loaded machine and far below the
former cost. Failure detection at these settings is checked by the partition tests
(test_netlab.py) and the stall test (tests/integration/test_stall.py)."""

from __future__ import annotations

import shutil
import time
import uuid

import pytest

from meshd.testing import MeshdProcess, short_tempdir, wait_until
from meshd.testing.netlab import Netlab, random_prefix, skip_reason

from .conftest import NetnsDaemon

HOSTS = 3
IDLE_S = 8.0
MAX_PACKETS_PER_PEER = 10.0  # ~5 measured; 32 before


def _online_peers(d: MeshdProcess) -> int:
    return sum(p["state"] == "online" for p in d.query("peers"))


def test_an_idle_mesh_costs_a_few_packets_per_second_per_peer() -> None:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    lab = Netlab(random_prefix("ti"))
    work = short_tempdir("mshti-")
    daemons: list[NetnsDaemon] = []
    try:
        lab.up(HOSTS)
        config = work / "meshd.toml"
        config.write_text("allow_insecure_lan = true\n")
        mesh = f"ti{uuid.uuid4().hex[:12]}"
        for i in range(1, HOSTS + 1):  # default liveness: heartbeat 1 s, stale 3 s, offline 10 s
            d = NetnsDaemon(lab.host(i), f"h{i}", mesh, work,
                            ["--config", str(config), "--interface", lab.address(i)])
            daemons.append(d)
            d.start(wait=False)
        for d in daemons:
            d.wait_ready()
        for d in daemons:
            wait_until(lambda d=d: _online_peers(d) == HOSTS - 1, 30, interval=0.1,
                       what=f"{d.name} to see every peer online")
        time.sleep(1.0)  # the directories and mDNS announcements of the start go by
        before = [lab.counters(i) for i in range(1, HOSTS + 1)]
        t0 = time.monotonic()
        time.sleep(IDLE_S)  # idleness is what is measured: nothing to wait for
        took = time.monotonic() - t0
        after = [lab.counters(i) for i in range(1, HOSTS + 1)]
        per_peer = [(a[0] - b[0]) / took / (HOSTS - 1) for a, b in zip(after, before, strict=True)]
        print(f"\n[netlab] idle packets/s per peer at each host: {[round(p, 1) for p in per_peer]}")
        assert all(p > 0.5 for p in per_peer), "the heartbeats themselves were not counted"
        assert all(p < MAX_PACKETS_PER_PEER for p in per_peer), per_peer
        assert all(_online_peers(d) == HOSTS - 1 for d in daemons), "a peer flapped at idle"
    finally:
        for d in daemons:
            d.terminate()
        lab.down()
        shutil.rmtree(work, ignore_errors=True)
