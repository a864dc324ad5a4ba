"""No unbounded growth: what a sender may pile up in a daemon is bounded, and the sender
is told (a typed error), never silently absorbed. Real daemons on 127.0.0.1."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgpack
import zmq

from meshd import Agent, MeshError
from meshd.testing import MeshdFactory, MeshdProcess, wait_listed
from meshd.wire import protocol as P


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _stuck_agent(ctx: zmq.Context[Any], proc: MeshdProcess, name: str) -> zmq.Socket[Any]:
    """An agent that registers and then never reads again."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 10)
    sock.setsockopt(zmq.RCVBUF, 4096)
    sock.connect(f"ipc://{proc.socket}")
    sock.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "register", "id": "r1"}),
                         msgpack.packb({"name": name})])
    assert sock.poll(5000)
    sock.recv_multipart()
    return sock


def _pending(proc: MeshdProcess) -> int:
    return int(proc.query("node")["qos1"]["pending"])


def test_qos1_outbox_is_bounded_per_destination_and_in_total(meshd_factory: MeshdFactory) -> None:
    """qos-1 sends to agents that never read fill the outbox up to its configured
    bounds, then the sender gets OUTBOX_FULL (retryable) for exactly the refused units."""
    env = {"MESHD_QOS1_OUTBOX_PER_DEST_MAX": "100", "MESHD_QOS1_OUTBOX_MAX": "150"}
    a = meshd_factory.spawn("a", env=env)
    b = meshd_factory.spawn("b", env=env)
    meshd_factory.wait_mesh([a, b])
    ctx: zmq.Context[Any] = zmq.Context()
    stuck = _stuck_agent(ctx, b, "stuck")
    stuck2 = _stuck_agent(ctx, b, "stuck2")

    async def flood(me: Agent, to: str, n: int) -> dict[str, int]:
        counts = {"ok": 0, "outbox_full": 0, "retryable": 0, "other": 0}

        async def one(i: int) -> None:
            try:
                await me.send(to, "spam", {"i": i, "blob": "x" * 200}, qos=1)
                counts["ok"] += 1
            except MeshError as exc:
                if exc.code == "OUTBOX_FULL":
                    counts["outbox_full"] += 1
                    counts["retryable"] += bool(exc.retryable)
                else:
                    counts["other"] += 1
        for start in range(0, n, 25):  # well under the flooder's own in-flight allowance
            await asyncio.gather(*(one(i) for i in range(start, min(n, start + 25))))
        return counts

    async def scenario() -> tuple[dict[str, int], dict[str, int], int, int]:
        async with Agent("flooder", socket=a.socket, batch_max=1) as me:
            await wait_listed(me, "stuck", "stuck2")
            rss_before = _rss_kib(a.pid)
            first = await flood(me, "stuck", 300)
            second = await flood(me, "stuck2", 100)
            again = await flood(me, "stuck", 1000)  # the bound holds however long it goes on
            rss_growth = _rss_kib(a.pid) - rss_before
            return first, second, again["outbox_full"], rss_growth

    try:
        first, second, refused_again, rss_growth = asyncio.run(scenario())
        pending = _pending(a)
        print(f"outbox bound: per-dest {first}, total {second}, refused later {refused_again}, "
              f"pending={pending}, sender rss growth={rss_growth} KiB")
        assert first == {"ok": 100, "outbox_full": 200, "retryable": 200, "other": 0}, first
        assert second == {"ok": 50, "outbox_full": 50, "retryable": 50, "other": 0}, second
        assert refused_again == 1000
        assert pending == 150
        assert rss_growth < 30 * 1024
        assert a.alive() and b.alive()
    finally:
        stuck.close(0)
        stuck2.close(0)
        ctx.term()


def test_no_legal_subscription_or_metadata_load_partitions_a_node(meshd_factory: MeshdFactory) -> None:
    """One agent subscribing to 5,000 topics of 250 characters (each legal) made the
    directory bigger than a peer accepts, and the node dropped off the mesh. Now the per-agent
    and per-node directory bounds refuse what does not fit with TOO_LARGE, and the node stays
    reachable throughout."""
    a = meshd_factory.spawn("a", env={"MESHD_DIRECTORY_MAX_BYTES": str(100 * 1024)})
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])

    async def hoard(me: Agent, asker: Agent, n: int) -> dict[str, int]:
        counts = {"subscribed": 0, "per_agent": 0, "per_node": 0, "other": 0}

        async def sub(i: int) -> None:
            try:
                await me.subscribe(f"{i:05d}" + "t" * 245)
                counts["subscribed"] += 1
            except MeshError as exc:
                if exc.code == "TOO_LARGE" and "max_subscriptions_per_agent" in exc.message:
                    counts["per_agent"] += 1
                elif exc.code == "TOO_LARGE" and "directory_max_bytes" in exc.message:
                    counts["per_node"] += 1
                else:
                    counts["other"] += 1
        for start in range(0, n, 50):
            await asyncio.gather(*(sub(i) for i in range(start, start + 50)))
            if start % 1000 == 0:  # the node stays reachable all along
                assert await asker.request("echo", "ping", {}, timeout=10) == "pong"
        return counts

    async def scenario() -> tuple[dict[str, int], dict[str, int], int]:
        meta_refused = 0
        async with Agent("hoarder", socket=a.socket) as hoarder, Agent("echo", socket=a.socket) as echo, \
                Agent("hoarder2", socket=a.socket) as hoarder2, Agent("asker", socket=b.socket) as asker:
            echo.on("ping")(lambda m: "pong")
            await wait_listed(asker, "echo", "hoarder", "hoarder2")
            first = await hoard(hoarder, asker, 5000)
            second = await hoard(hoarder2, asker, 300)
            for i in range(3):  # 60 KiB of metadata each: over agent_metadata_max_bytes
                try:
                    async with Agent(f"fat{i}", socket=a.socket, metadata={"blob": "m" * 60 * 1024}):
                        pass
                except MeshError as exc:
                    meta_refused += exc.code == "TOO_LARGE" and "agent_metadata_max_bytes" in exc.message
            assert await asker.request("echo", "ping", {}, timeout=10) == "pong"
            await wait_listed(asker, "hoarder", "hoarder2")
        return first, second, meta_refused

    first, second, meta_refused = asyncio.run(scenario())
    states = b.peer_states()
    sent = a.query("node").get("stats", {}).get("directory_sent")
    print(f"directory bounds: first agent {first}, second agent {second}, metadata refused "
          f"{meta_refused}/3, b sees a: {states.get(a.node_id)}, dir bodies sent: {sent}")
    assert first == {"subscribed": 256, "per_agent": 4744, "per_node": 0, "other": 0}, first
    assert 0 < second["subscribed"] < 256 and second["per_node"] == 300 - second["subscribed"], second
    assert meta_refused == 3
    assert states.get(a.node_id) == "online"
    assert a.alive() and b.alive()
