"""Sixteen real daemons on one netlab LAN with the default liveness (root).

The mesh forms, stays put for a minute at idle (no peer goes stale anywhere: counted from each
daemon's own counters, not timed), answers a request across it, notices a kill -9 on every other
host, and notices and heals a partition of four hosts. The figures (seconds to each state) are
printed; the bounds only say when to give up, loose enough for a loaded 2-core CI machine running
16 Python daemons. bench/idle_lan.py measures the packets and CPU of such a mesh.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from meshd.client import BlockingAgent
from meshd.testing import short_tempdir, wait_until
from meshd.testing.netlab import Netlab, random_prefix, skip_reason

from .conftest import NetnsDaemon

pytestmark = pytest.mark.multihost

HOSTS = 16
IDLE_S = 60.0
KILLED = HOSTS
CUT = [12, 13, 14, 15]
BOUND_S = 60.0  # when to give up; the defaults say stale in ~3 s and offline in ~10 s


class Lan:
    def __init__(self) -> None:
        self.lab = Netlab(random_prefix("sc"))
        self.work = short_tempdir("mshsc-")
        self.daemons: dict[int, NetnsDaemon] = {}
        self.node_ids: dict[int, str] = {}

    def peers(self, at: int) -> dict[str, str]:
        return {str(p["node"]): str(p["state"]) for p in self.daemons[at].query("peers")}

    def stats(self, at: int) -> dict[str, Any]:
        return dict(self.daemons[at].query("node")["stats"])

    def online_count(self, at: int) -> int:
        return sum(state == "online" for state in self.peers(at).values())


@pytest.fixture
def lan(request: pytest.FixtureRequest) -> Iterator[Lan]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    lan = Lan()
    failed_before = request.session.testsfailed
    try:
        lan.lab.up(HOSTS)
        config = lan.work / "meshd.toml"
        config.write_text("allow_insecure_lan = true\n")
        mesh = f"sc{uuid.uuid4().hex[:12]}"
        for i in range(1, HOSTS + 1):  # default liveness: heartbeat 1 s, stale 3 s, offline 10 s
            lan.daemons[i] = NetnsDaemon(lan.lab.host(i), f"h{i}", mesh, lan.work,
                                         ["--config", str(config), "--interface", lan.lab.address(i)])
            lan.daemons[i].start(wait=False)
        for i, d in lan.daemons.items():
            d.wait_ready()
            lan.node_ids[i] = str(d.query("node")["node"])
        yield lan
    finally:
        try:
            for d in lan.daemons.values():
                d.terminate()
            if request.session.testsfailed > failed_before:
                for d in list(lan.daemons.values())[:4]:
                    print(f"\n--- log of meshd {d.name} ---\n{d.log()[-4000:]}")
        finally:
            lan.lab.down()
            shutil.rmtree(lan.work, ignore_errors=True)


def test_sixteen_daemons_form_stay_put_at_idle_and_detect_a_kill_and_a_partition(lan: Lan) -> None:
    t0 = time.monotonic()
    for at in lan.daemons:
        wait_until(lambda at=at: lan.online_count(at) == HOSTS - 1, BOUND_S, interval=0.2,
                   what=f"h{at} to see {HOSTS - 1} peers online")
    print(f"\n[netlab] {HOSTS} daemons: full mesh {time.monotonic() - t0:.1f} s after the last was ready")

    stale_before = {at: int(lan.stats(at).get("peer_stale", 0)) for at in lan.daemons}
    time.sleep(IDLE_S)  # idleness is what is checked: nothing to wait for
    flapped = {at: int(lan.stats(at).get("peer_stale", 0)) - stale_before[at] for at in lan.daemons}
    assert not any(flapped.values()), f"peers went stale at idle: {flapped}"
    assert all(lan.online_count(at) == HOSTS - 1 for at in lan.daemons)

    echo = BlockingAgent("echo15", socket=lan.daemons[KILLED - 1].socket)
    asker = BlockingAgent("asker1", socket=lan.daemons[1].socket)
    try:
        echo.on("echo")(lambda msg: {"got": msg.payload})

        def answered() -> bool:
            try:
                return bool(asker.request("echo15", "echo", 1, timeout=5) == {"got": 1})
            except Exception:  # not listed on h1 yet
                return False
        wait_until(answered, BOUND_S, interval=0.2, what="a request from h1 to h15 answered")
        for i in range(20):
            assert asker.request("echo15", "echo", i, timeout=10) == {"got": i}
    finally:
        echo.close()
        asker.close()

    killed = lan.node_ids[KILLED]
    t1 = time.monotonic()
    lan.daemons[KILLED].kill()
    others = [at for at in lan.daemons if at != KILLED]
    for at in others:
        wait_until(lambda at=at: lan.peers(at).get(killed) in ("offline", None), BOUND_S, interval=0.2,
                   what=f"h{at} to see the killed h{KILLED} offline")
    print(f"[netlab] kill -9 of h{KILLED}: offline at all {len(others)} others after "
          f"{time.monotonic() - t1:.1f} s")

    t2 = time.monotonic()
    for i in CUT:
        lan.lab.cut(i)
    cut_ids = {lan.node_ids[i] for i in CUT}
    rest = [at for at in others if at not in CUT]
    for at in rest:
        wait_until(lambda at=at: all(lan.peers(at).get(n) in ("offline", None) for n in cut_ids), BOUND_S,
                   interval=0.2, what=f"h{at} to see the {len(CUT)} cut hosts offline")
    print(f"[netlab] partition of {len(CUT)} hosts: offline at the other {len(rest)} after "
          f"{time.monotonic() - t2:.1f} s")
    t3 = time.monotonic()
    for i in CUT:
        lan.lab.plug(i)
    for at in others:
        wait_until(lambda at=at: lan.online_count(at) == HOSTS - 2, BOUND_S * 2, interval=0.2,
                   what=f"h{at} to see every live peer online again")
    print(f"[netlab] heal: all {len(others)} live daemons see each other online "
          f"{time.monotonic() - t3:.1f} s after the plug")
