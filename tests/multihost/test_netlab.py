"""Three hosts on a netlab LAN: discovery, cross-host requests, partition and heal.

Hosts 1..3 each run a daemon (fast timers: beat 0.25 s, stale 1 s, offline 2 s) and an agent
``echo<i>``. The tests run in order and share the mesh; ``test_heal`` cuts host 2 itself when run
alone. Timings are printed for the record (``-s``), never asserted.
"""

from __future__ import annotations

import time

import pytest

from meshd.errors import MeshError, NoSuchAgent, PeerUnreachable
from meshd.testing import wait_until

pytestmark = pytest.mark.multihost

WAIT = 15.0
CUT = 2  # the host that gets partitioned
OTHERS = (1, 3)


def _elapsed(t0: float) -> str:
    return f"{time.monotonic() - t0:.2f} s"


def _gone(mh, at: int, host: int) -> bool:
    """Host ``at`` no longer counts ``host`` as online (offline or not listed) nor lists its agent."""
    return mh.state_of(at, host) in ("offline", None) and mh.agent_name(host) not in mh.agent_names(at)


def _cut_and_wait(mh) -> None:
    mh.lab.cut(CUT)
    for at in OTHERS:
        wait_until(lambda at=at: _gone(mh, at, CUT), WAIT, interval=0.05,
                   what=f"h{at} to see h{CUT} offline")


def test_discovery_across_hosts(multihost) -> None:
    mh = multihost
    mh.wait_full_mesh(timeout=WAIT)
    print(f"\n[netlab] full mesh (3 hosts online at each other, agents listed) "
          f"{_elapsed(mh.started_at)} after starting the daemons")
    for at in mh.agents:
        assert mh.agent_names(at) >= {mh.agent_name(i) for i in mh.agents}


def test_request_host1_to_host3(multihost) -> None:
    mh = multihost
    mh.wait_full_mesh(timeout=WAIT)
    reply = mh.agents[1].request("echo3", "echo", {"q": "ping", "n": 1}, timeout=5)
    assert reply == {"host": 3, "from": "echo1", "payload": {"q": "ping", "n": 1}}
    # Addressed to a node explicitly, by its name.
    reply = mh.agents[1].request("echo3@h3", "echo", [1, 2, 3], timeout=5)
    assert reply == {"host": 3, "from": "echo1", "payload": [1, 2, 3]}


def test_partition(multihost) -> None:
    mh = multihost
    mh.wait_full_mesh(timeout=WAIT)
    t0 = time.monotonic()
    mh.lab.cut(CUT)
    not_online: dict[int, float] = {}
    offline: dict[int, float] = {}
    agent_gone: dict[int, float] = {}
    sent = ok = 0
    failures: list[str] = []
    deadline = t0 + WAIT
    while len(offline) < len(OTHERS) or len(agent_gone) < len(OTHERS):
        assert time.monotonic() < deadline, (
            f"h{CUT} still not offline at {sorted(set(OTHERS) - set(offline))} "
            f"or its agent still listed at {sorted(set(OTHERS) - set(agent_gone))} after {WAIT:g} s")
        for at in OTHERS:
            now = time.monotonic() - t0
            state = mh.state_of(at, CUT)
            if state != "online":
                not_online.setdefault(at, now)
            if state in ("offline", None):
                offline.setdefault(at, now)
            if mh.agent_name(CUT) not in mh.agent_names(at):
                agent_gone.setdefault(at, now)
        # Meanwhile the rest of the mesh keeps working.
        sent += 1
        try:
            reply = mh.agents[1].request("echo3", "echo", sent, timeout=2)
            assert reply == {"host": 3, "from": "echo1", "payload": sent}
            ok += 1
        except MeshError as exc:
            failures.append(f"#{sent} at {_elapsed(t0)}: {exc!r}")
        time.sleep(0.05)
    for at in OTHERS:
        print(f"\n[netlab] partition: h{at} saw h{CUT} not online after {not_online.get(at, -1):.2f} s, "
              f"offline after {offline[at]:.2f} s, its agent gone after {agent_gone[at]:.2f} s", end="")
    print(f"\n[netlab] partition: h1 -> h3 requests meanwhile: sent={sent} ok={ok} failed={len(failures)}")
    assert not failures, failures
    # The cut host's agent is no longer routable from host 1: a fast typed error, not a time-out.
    t1 = time.monotonic()
    with pytest.raises((NoSuchAgent, PeerUnreachable)):
        mh.agents[1].request("echo2", "echo", "x", timeout=5)
    print(f"[netlab] partition: h1 -> echo2 refused in {_elapsed(t1)}")
    # Host 2 sees the others go too, while its own agent (on the ipc socket) stays attached.
    for host in OTHERS:
        wait_until(lambda host=host: _gone(mh, CUT, host), WAIT, interval=0.05,
                   what=f"h{CUT} to see h{host} offline")
    assert mh.agent_name(CUT) in mh.agent_names(CUT)
    print(f"[netlab] partition: h{CUT} saw h1 and h3 offline {_elapsed(t0)} after the cut")


def test_heal(multihost) -> None:
    mh = multihost
    if CUT not in mh.lab.cut_hosts:  # run on its own: partition first
        mh.wait_full_mesh(timeout=WAIT)
        _cut_and_wait(mh)
    t0 = time.monotonic()
    mh.lab.plug(CUT)
    back: dict[tuple[int, int], float] = {}
    pairs = [(at, CUT) for at in OTHERS] + [(CUT, host) for host in OTHERS]
    for at, host in pairs:
        wait_until(lambda at=at, host=host: mh.sees_online(at, host), WAIT * 2, interval=0.05,
                   what=f"h{at} to see h{host} online again with its agent")
        back[(at, host)] = time.monotonic() - t0
    for (at, host), secs in back.items():
        print(f"\n[netlab] heal: h{at} saw h{host} online with its agent {secs:.2f} s after the plug", end="")
    print()
    reply = mh.agents[1].request("echo2", "echo", {"after": "heal"}, timeout=5)
    assert reply == {"host": 2, "from": "echo1", "payload": {"after": "heal"}}
    reply = mh.agents[2].request("echo3", "echo", "back", timeout=5)
    assert reply == {"host": 3, "from": "echo2", "payload": "back"}
    print(f"[netlab] heal: h1 -> echo2 and h2 -> echo3 requests ok {_elapsed(t0)} after the plug")


def test_name_taken_on_both_sides_of_a_partition_is_resolved_on_heal(multihost) -> None:
    """While h2 is cut off, an agent named "twin" registers on h1 and on h2: each side accepts
    it, since neither can see the other. After the heal exactly one survives mesh-wide: the one
    with the smaller (registration counter, node id), the same on every node (no wall
    clock decides: hosts' clocks differ); the other agent is told NAME_TAKEN and removed."""
    from meshd.client import BlockingAgent

    mh = multihost
    mh.wait_full_mesh(timeout=WAIT)
    _cut_and_wait(mh)
    first = BlockingAgent("twin", socket=mh.daemons[1].socket, heartbeat_interval=0.25)
    errors = {1: [], CUT: []}
    first.agent.on_error = lambda err, corr: errors[1].append(err)
    try:
        second = BlockingAgent("twin", socket=mh.daemons[CUT].socket, heartbeat_interval=0.25)
        second.agent.on_error = lambda err, corr: errors[CUT].append(err)
        try:
            assert "twin" in mh.agent_names(1) and "twin" in mh.agent_names(CUT)
            regs = {at: _twin_reg(mh, at) for at in (1, CUT)}
            winner = min((1, CUT), key=lambda at: (regs[at], mh.node_ids[at]))
            loser_host = CUT if winner == 1 else 1
            loser = second if winner == 1 else first
            t0 = time.monotonic()
            mh.lab.plug(CUT)
            wait_until(lambda: any(e.code == "NAME_TAKEN" for e in errors[loser_host]), WAIT,
                       what=f"h{loser_host}'s twin to be told NAME_TAKEN")
            print(f"\n[netlab] name conflict resolved {_elapsed(t0)} after the heal "
                  f"(reg h1={regs[1]} h{CUT}={regs[CUT]}: h{winner} keeps it)")
            assert loser.agent.evicted is not None  # its calls now raise NameTaken
            with pytest.raises(MeshError, match="twin"):
                loser.send("echo3", "x", {})
            for at in mh.agents:
                wait_until(lambda at=at: _twin_node(mh, at) == mh.node_ids[winner], WAIT, interval=0.05,
                           what=f"h{at} to list twin on h{winner} only")
            assert not errors[winner]
        finally:
            second.close()
    finally:
        first.close()


def _twin_reg(mh, at: int) -> int:
    [reg] = [a["reg"] for a in mh.agents[at].agents() if a["name"] == "twin"]
    return int(reg)


def _twin_node(mh, at: int) -> str | None:
    nodes = [a["node"] for a in mh.agents[at].agents() if a["name"] == "twin"]
    return nodes[0] if len(nodes) == 1 else None
