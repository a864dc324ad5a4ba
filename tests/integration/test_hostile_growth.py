"""Issue 8, unbounded growth: what a sender may pile up in a daemon is bounded, and the sender
is told (a typed error), never silently absorbed. Real daemons on 127.0.0.1."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgpack
import zmq

from meshd import Agent, MeshError
from meshd import protocol as P
from meshd.testing import MeshdFactory, MeshdProcess, wait_listed


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
    """Item 16: qos-1 sends to agents that never read fill the outbox up to its configured
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
        for start in range(0, n, 25):  # well under the flooder's own inbox cap (issue 8, item 6)
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
