"""Clock independence on a netlab LAN: host 2's daemon runs with its wall clock an hour behind or ahead
(libfaketime, monotonic clock untouched). A name taken before a partition and taken again on the
cut-off side during it stays with its first holder after the heal, on every node: the
registration counter orders it, not the clocks (with the wall clock an hour behind, the second
registration would have looked an hour older). Requests still cross the skewed host.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from meshd.client import BlockingAgent
from meshd.errors import MeshError
from meshd.testing import faketime_env, libfaketime, short_tempdir, wait_until

from .conftest import MultiHost, Netlab, _prefix, running, skip_reason

pytestmark = pytest.mark.multihost

WAIT = 15.0
SKEWED = 2


@pytest.fixture(scope="module", params=["-1h", "+1h"])
def skewed(request: pytest.FixtureRequest) -> Iterator[MultiHost]:
    reason = skip_reason() or (None if libfaketime() else "libfaketime (package 'faketime') is not installed")
    if reason:
        pytest.skip(reason)
    mh = MultiHost(Netlab("ck" + _prefix()[2:]), short_tempdir("mshck-"), mesh=f"ck{uuid.uuid4().hex[:12]}",
                   env={SKEWED: faketime_env(request.param)})
    with running(request, mh):
        yield mh


def _holder(mh: MultiHost, at: int, name: str) -> str | None:
    nodes = [a["node"] for a in mh.agents[at].agents() if a["name"] == name]
    return str(nodes[0]) if len(nodes) == 1 else None


def test_requests_cross_the_skewed_host(skewed: MultiHost) -> None:
    mh = skewed
    mh.wait_full_mesh(timeout=WAIT)
    for at, to in ((1, SKEWED), (SKEWED, 3), (3, SKEWED)):
        reply = mh.agents[at].request(mh.agent_name(to), "echo", {"n": at}, timeout=5)
        assert reply["host"] == to


def test_a_name_held_before_a_partition_keeps_its_holder(skewed: MultiHost) -> None:
    mh = skewed
    mh.wait_full_mesh(timeout=WAIT)
    first = BlockingAgent("keeper", socket=mh.daemons[1].socket, heartbeat_interval=0.25)
    errors: dict[int, list[MeshError]] = {1: [], SKEWED: []}
    first.agent.on_error = lambda err, corr: errors[1].append(err)
    try:
        wait_until(lambda: _holder(mh, SKEWED, "keeper") == mh.node_ids[1], WAIT, interval=0.05,
                   what="the skewed host to know keeper")
        mh.lab.cut(SKEWED)
        wait_until(lambda: _holder(mh, SKEWED, "keeper") is None, WAIT, interval=0.05,
                   what="the cut-off host to forget keeper")
        wait_until(lambda: _holder(mh, 1, "echo2") is None, WAIT, interval=0.05,
                   what="h1 to see h2 gone")
        second = BlockingAgent("keeper", socket=mh.daemons[SKEWED].socket, heartbeat_interval=0.25)
        second.agent.on_error = lambda err, corr: errors[SKEWED].append(err)
        try:
            regs = {at: next(a for a in mh.agents[at].agents() if a["name"] == "keeper")["reg"]
                    for at in (1, SKEWED)}
            assert regs[SKEWED] > regs[1]  # Lamport: registered after h2 had seen h1's record
            t0 = time.monotonic()
            mh.lab.plug(SKEWED)
            wait_until(lambda: any(e.code == "NAME_TAKEN" for e in errors[SKEWED]), WAIT,
                       what="the second keeper to be told NAME_TAKEN")
            print(f"\n[netlab] skewed host: conflict resolved {time.monotonic() - t0:.2f} s after the heal "
                  f"(reg h1={regs[1]} h2={regs[SKEWED]})")
            for at in mh.agents:
                wait_until(lambda at=at: _holder(mh, at, "keeper") == mh.node_ids[1], WAIT, interval=0.05,
                           what=f"h{at} to list keeper on h1 only")
            assert not errors[1] and second.agent.evicted is not None
        finally:
            second.close()
    finally:
        first.close()
