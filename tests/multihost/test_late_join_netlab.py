"""A node that misses its first seconds on the LAN still joins (netlab, root).

Hosts 1 and 2 form a mesh. Host 3's daemon starts while its traffic is dropped for 15 s, either
silently at its switch port (as a managed switch does while a new port is listening/learning) or
by its own firewall; then the traffic flows again. zeroconf's browser alone queries at 0, 1, 4
and 9 s and then not for about an hour, so before the re-query loop (meshd/discovery/mdns.py)
host 3 stayed alone for minutes and nobody listed it. Now it must join soon after the LAN comes
back, and while alone it logs, once, what it heard.

Figures (seconds from restore to a full mesh, queries sent) are printed, never asserted; the
bound only says when to give up.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from meshd.client import BlockingAgent, Message
from meshd.testing import short_tempdir, wait_until
from meshd.testing.netlab import random_prefix, skip_reason

from .conftest import AGENT_HEARTBEAT, FAST, HOSTS, MultiHost, Netlab, NetnsDaemon, running

pytestmark = pytest.mark.multihost

LATE = 3
OUTAGE_S = 15.0
JOIN_BOUND_S = 30.0  # generous: a loaded CI machine; the figure is printed


class LateHost(MultiHost):
    """Hosts 1..HOSTS-1 start first; host LATE starts with its traffic dropped by ``fault``."""

    fault = "silence"

    def start(self) -> None:
        config = self.workdir / "meshd.toml"
        config.write_text("allow_insecure_lan = true\nalone_warning_after = 5\n")
        for i in range(1, HOSTS + 1):
            self.daemons[i] = NetnsDaemon(self.lab.host(i), f"h{i}", self.mesh, self.workdir,
                                          ["--config", str(config), "--interface", self.address(i), *FAST])
        for i in range(1, HOSTS):
            self.daemons[i].start(wait=False)
        for i in range(1, HOSTS):
            self.daemons[i].wait_ready()
            self._attach(i)

    def _attach(self, i: int) -> None:
        agent = BlockingAgent(self.agent_name(i), socket=self.daemons[i].socket,
                              heartbeat_interval=AGENT_HEARTBEAT)
        self.agents[i] = agent
        self.node_ids[i] = str(agent.agent.node)

        @agent.on("echo")
        def echo(msg: Message, i: int = i) -> Any:
            return {"host": i, "payload": msg.payload}

    def start_late(self) -> float:
        """Drop host LATE's traffic, start its daemon, keep dropping for OUTAGE_S; the monotonic
        time the traffic flows again."""
        getattr(self.lab, self.fault)(LATE)
        try:
            self.daemons[LATE].start(wait=True)
            self._attach(LATE)
            end = time.monotonic() + OUTAGE_S
            while time.monotonic() < end:  # the fault itself lasts this long: nothing to await
                assert self.daemons[LATE].proc is not None and self.daemons[LATE].proc.poll() is None
                time.sleep(0.5)
            assert not self.sees_online(LATE, 1), "host 3 saw a peer through the fault: no fault?"
        finally:
            getattr(self.lab, "un" + self.fault)(LATE)
        return time.monotonic()


@pytest.fixture(params=["silence", "block"])
def late(request: pytest.FixtureRequest) -> Iterator[LateHost]:
    reason = skip_reason(need_nft=True)
    if reason:
        pytest.skip(reason)
    mh = LateHost(Netlab(random_prefix("lj")), short_tempdir("mshlj-"), mesh=f"lj{uuid.uuid4().hex[:12]}")
    mh.fault = request.param
    with running(request, mh):
        mh.wait_full_mesh()  # the first two
        yield mh


def test_a_node_that_misses_its_first_seconds_joins_when_the_lan_comes_back(late: LateHost) -> None:
    restored = late.start_late()
    late.wait_full_mesh(timeout=JOIN_BOUND_S)
    joined = time.monotonic() - restored
    reply = late.agents[1].request(late.agent_name(LATE), "echo", "hi", timeout=5)
    assert reply["host"] == LATE
    info = late.agents[LATE].agent  # the late node's own account of what it did
    node = late.agents[LATE].node_info()
    assert node["discovery"]["requeries"] >= 2, node["discovery"]
    log = late.daemons[LATE].log()
    assert "no peer for" in log and "it heard no node of mesh" in log, log[-3000:]
    print(f"\n  late join ({late.fault} {OUTAGE_S:g} s at start): full mesh {joined:.1f} s after the "
          f"traffic flowed again; {node['discovery']['requeries']} re-queries by host 3 ({info.name})")


@pytest.fixture
def tcp_cut(request: pytest.FixtureRequest) -> Iterator[LateHost]:
    reason = skip_reason(need_nft=True)
    if reason:
        pytest.skip(reason)
    mh = LateHost(Netlab(random_prefix("lt")), short_tempdir("mshlt-"), mesh=f"lt{uuid.uuid4().hex[:12]}")
    with running(request, mh):
        mh.wait_full_mesh()
        mh.lab.block(LATE, only="tcp")  # mDNS flows, the mesh's TCP does not
        mh.daemons[LATE].start(wait=True)
        mh._attach(LATE)
        yield mh


def test_the_doctor_names_nodes_it_hears_but_cannot_reach(tcp_cut: LateHost) -> None:
    """The node hears both others on mDNS but cannot reach their TCP ports: "no problem found"
    before; now `meshctl doctor` names each as discovered_not_connected, and its passive listen
    (meshd answers heard, no peer online) adds alone_but_answered."""
    mh = tcp_cut
    ids = {mh.node_ids[1], mh.node_ids[2]}
    wait_until(lambda: {a["node"] for a in mh.agents[LATE].admin("doctor")["facts"]["heard_on_mdns"]} >= ids,
               20, what="host 3's discovery to resolve both other nodes")
    ctl = ("import sys; from meshd.cli import meshctl_main; "
           "sys.exit(meshctl_main(sys.argv[1:]))")
    done = subprocess.run(mh.lab.exec_args(LATE, sys.executable, "-c", ctl, "--socket",
                                           str(mh.daemons[LATE].socket), "doctor", "--json", "--listen", "3"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr  # a problem found
    report = json.loads(done.stdout)
    codes = [p["code"] for p in report["problems"]]
    named = {p["message"].split()[1] for p in report["problems"] if p["code"] == "discovered_not_connected"}
    assert named == ids, report["problems"]
    assert "alone_but_answered" in codes, (codes, report["facts"].get("mdns"))
