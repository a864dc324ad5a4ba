"""A mesh whose nodes run in two security modes says so (netlab, root).

Same mesh name; hosts 1 and 2 run plaintext (``--insecure``, ``allow_insecure_lan``), host 3 runs
CurveZMQ. Plaintext and CURVE cannot talk: before, all three listed each other offline, no log
line said why and the doctor blamed a firewall. Now each node refuses the other mode by name
(``other-security``): logged once, listed by ``meshctl peers --all`` (admin ``peers.discovered``)
and named by the doctor, while the two plaintext nodes form their mesh as usual.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from meshd.client import BlockingAgent, Message
from meshd.testing import short_tempdir, wait_until
from meshd.testing.netlab import random_prefix, skip_reason

from .conftest import AGENT_HEARTBEAT, FAST, HOSTS, MultiHost, Netlab, NetnsDaemon, running

pytestmark = pytest.mark.multihost

CURVE_HOST = 3


class MixedHosts(MultiHost):
    def start(self) -> None:
        config = self.workdir / "meshd.toml"
        config.write_text("allow_insecure_lan = true\n")
        for i in range(1, HOSTS + 1):
            secure = i == CURVE_HOST
            self.daemons[i] = NetnsDaemon(self.lab.host(i), f"h{i}", self.mesh, self.workdir,
                                          [*(() if secure else ("--config", str(config))),
                                           "--interface", self.address(i), *FAST], secure=secure)
        for d in self.daemons.values():
            d.start(wait=False)
        for d in self.daemons.values():
            d.wait_ready()
        for i, d in self.daemons.items():
            agent = BlockingAgent(self.agent_name(i), socket=d.socket, heartbeat_interval=AGENT_HEARTBEAT)
            self.agents[i] = agent
            self.node_ids[i] = str(agent.agent.node)

            @agent.on("echo")
            def echo(msg: Message, i: int = i) -> Any:
                return {"host": i}


@pytest.fixture(scope="module")
def mixed(request: pytest.FixtureRequest) -> Iterator[MixedHosts]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    mh = MixedHosts(Netlab(random_prefix("mx")), short_tempdir("mshmx-"), mesh=f"mx{uuid.uuid4().hex[:12]}")
    with running(request, mh):
        yield mh


def _admin(mh: MixedHosts, at: int, op: str) -> Any:
    return mh.agents[at].admin(op)


def _refused_as_other_security(mh: MixedHosts, at: int) -> set[str]:
    return {str(row["node"]) for row in _admin(mh, at, "peers.discovered")
            if row["state"] == "other-security"}


def test_each_mode_names_the_other_and_the_plaintext_pair_still_forms(mixed: MixedHosts) -> None:
    mixed.wait_full_mesh(among=[1, 2])
    curve, plain = mixed.node_ids[CURVE_HOST], {mixed.node_ids[1], mixed.node_ids[2]}
    wait_until(lambda: _refused_as_other_security(mixed, CURVE_HOST) == plain, 20,
               what="the CURVE node to list both plaintext nodes as other-security")
    for i in (1, 2):
        wait_until(lambda i=i: curve in _refused_as_other_security(mixed, i), 20,
                   what=f"h{i} to list the CURVE node as other-security")
        assert mixed.state_of(i, CURVE_HOST) in (None, "offline")
    log_plain, log_curve = mixed.daemons[1].log(), mixed.daemons[CURVE_HOST].log()
    assert "runs CurveZMQ and this node runs plaintext (--insecure)" in log_plain, log_plain[-2000:]
    assert log_plain.count(f"not dialing node {curve}") == 1  # once, not per advert
    assert "runs plaintext (--insecure) and this node runs CurveZMQ" in log_curve, log_curve[-2000:]
    report = _admin(mixed, CURVE_HOST, "doctor")
    codes = [p["code"] for p in report["problems"]]
    assert codes.count("other_security") == 2, report["problems"]
    assert not [c for c in codes if c in ("unreachable", "no_mdns", "discovered_not_connected")], codes
