"""Priorities on real daemons: under a backlog, lower numbers are served first, FIFO within one
priority and one sender (counted, not timed); the range is checked at both edges."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest

from meshd import Agent, ValidationFailed
from meshd.testing import (
    MeshdFactory,
    async_wait_until,
    raw_agent,
    recv_skipping_pings,
    register_raw,
    wait_listed,
)
from meshd.wire import protocol as P


def test_a_backlog_is_served_by_priority_across_daemons(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])

    async def scenario() -> None:
        async with Agent("worker", socket=b.socket, max_concurrent_handlers=1) as worker, \
                Agent("bulk", socket=a.socket) as bulk, Agent("boss", socket=a.socket) as boss:
            gate = asyncio.Event()
            order: list[tuple[str, Any]] = []

            @worker.on("job")
            async def job(msg: Any) -> Any:
                order.append((msg.sender, msg.payload))
                if msg.payload == "gate":
                    await gate.wait()  # holds the one slot: what follows waits
                await asyncio.sleep(0)  # every handler suspends, so each takes the slot in turn
                return msg.payload

            await wait_listed(bulk, "worker")
            await bulk.send("worker", "job", "gate")
            await async_wait_until(lambda: order == [("bulk", "gate")])
            for i in range(40):
                await bulk.send("worker", "job", ("p9", i), priority=9)
            for i in range(10):
                await bulk.send("worker", "job", ("p5", i))
            for i in range(10):
                await bulk.send("worker", "job", ("p0", i), priority=0)
            urgent = asyncio.ensure_future(boss.request("worker", "job", ("r0", 0), priority=0, timeout=20))
            # everything is parked at the worker (it reads on while every slot is taken)
            await async_wait_until(lambda: len(worker._handler_slots.parked) == 61)
            gate.set()
            assert await urgent == ["r0", 0]
            await async_wait_until(lambda: len(order) == 62)
            got = [tuple(p) for _, p in order[1:]]
            p0 = [("p0", i) for i in range(10)]
            assert sorted(got[:11]) == sorted([*p0, ("r0", 0)]), got[:11]  # priority 0 first (two senders)
            assert [p for p in got[:11] if p[0] == "p0"] == p0  # FIFO within a priority and sender
            assert got[11:21] == [("p5", i) for i in range(10)]
            assert got[21:] == [("p9", i) for i in range(40)]

    asyncio.run(scenario())


def test_publications_wait_by_priority_too(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])

    async def scenario() -> None:
        async with Agent("sub", socket=b.socket, max_concurrent_handlers=1) as sub, \
                Agent("pub", socket=a.socket) as pub:
            gate = asyncio.Event()
            seen: list[Any] = []

            @sub.on("feed.>")
            async def feed(msg: Any) -> None:
                seen.append(msg.payload)
                if msg.payload == "gate":
                    await gate.wait()
                await asyncio.sleep(0)

            await sub.subscribe("feed.>")

            async def listed() -> bool:
                recs = {r["name"]: r for r in await pub.agents()}
                return "feed.>" in (recs.get("sub", {}).get("topics") or [])
            await async_wait_until(listed)
            await pub.publish("feed.x", "gate", reach=True)
            await async_wait_until(lambda: seen == ["gate"])
            for i in range(20):
                await pub.publish("feed.low", i, priority=9)
            for i in range(5):
                await pub.publish("feed.high", 100 + i, priority=1)
            await async_wait_until(lambda: len(sub._handler_slots.parked) == 25)
            gate.set()
            await async_wait_until(lambda: len(seen) == 26)
            assert seen[1:] == [100 + i for i in range(5)] + list(range(20))

    asyncio.run(scenario())


def test_the_range_is_checked_at_both_edges(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")

    async def scenario() -> None:
        async with Agent("me", socket=a.socket) as me:
            for bad in (-1, 10, 2.5):
                with pytest.raises(ValidationFailed, match="priority"):
                    await me.send("me", "t", None, priority=bad)  # type: ignore[arg-type]
            with pytest.raises(ValidationFailed, match="priority"):
                await me.request("me", "t", None, priority=11)
            with pytest.raises(ValidationFailed, match="priority"):
                await me.publish("t", None, priority=-3)
        ctx, sock = raw_agent(a.socket)
        try:
            await register_raw(sock, "raw")
            header = {"kind": "send", "id": "x1", "from": "raw", "to": "raw", "topic": "t", P.PRIO: 12}
            sock.send_multipart([P.SIGNATURE, msgpack.packb(header), b"\xc0"])
            answer = await asyncio.to_thread(recv_skipping_pings, sock)
            assert answer["kind"] == "error" and answer["error"]["code"] == "VALIDATION_FAILED"
            assert "'prio'" in answer["error"]["message"]
        finally:
            sock.close(0)
            ctx.term()
        assert a.query("node")["stats"].get("malformed_bad_field", 0) >= 1

    asyncio.run(scenario())


def test_an_urgent_request_waits_at_a_full_inbox_instead_of_bouncing(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b", env={"MESHD_INBOX_CAP": "20"})
    meshd_factory.wait_mesh([a, b])

    def full_refusals() -> int:
        return int(b.query("node")["stats"].get("undeliverable_inbox_full", 0))

    async def scenario() -> None:
        async with Agent("worker", socket=b.socket, max_concurrent_handlers=1) as worker, \
                Agent("bulk", socket=a.socket, batch_max=1) as bulk, Agent("boss", socket=a.socket) as boss:
            gate = asyncio.Event()
            order: list[Any] = []
            bulk.on_error = lambda err, _id: None  # its refused sends: INBOX_FULL, expected here

            @worker.on("job")
            async def job(msg: Any) -> Any:
                order.append(msg.payload)
                if msg.payload == "gate":
                    await gate.wait()
                await asyncio.sleep(0)
                return msg.payload

            await wait_listed(bulk, "worker")
            await bulk.send("worker", "job", "gate")
            await async_wait_until(lambda: order == ["gate"])

            async def flood() -> None:
                for i in range(3000):
                    await bulk.send("worker", "job", i, priority=9)
            # the worker's parked work, its pipe and its daemon's inbox fill up: the rest bounces,
            # and with nothing read meanwhile they stay full
            await asyncio.wait_for(flood(), 60)
            assert full_refusals() > 0
            def seen() -> int:  # what b did with data for the worker: delivered, held or bounced
                st = b.query("node")["stats"]
                return sum(int(st.get(k, 0)) for k in ("delivered", "undeliverable_inbox_full"))
            before = seen()
            urgent = asyncio.ensure_future(boss.request("worker", "job", "urgent", priority=0, timeout=30))
            # it waits at the daemon if the inbox is full (a ZeroMQ pipe frees room in bursts, so it
            # may also get straight in): either way no INBOX_FULL, and it overtakes parked work
            await async_wait_until(lambda: seen() > before)
            gate.set()
            assert await urgent == "urgent"
            # Work it overtook is handled after it: wait for the first (the reply to the urgent
            # request may reach us before the worker has handled anything after it).
            try:
                await async_wait_until(lambda: order[-1] != "urgent", timeout=20)
            except TimeoutError:
                pass  # nothing came after it: the assertion below says so
            after = order[order.index("urgent") + 1:]
            before = order[1:order.index("urgent")]
            print(f"priority-9 handled before the urgent request: {len(before)}, after it: {len(after)}")
            assert after, "the urgent request overtook work that was waiting"
            assert before == sorted(before) and after == sorted(after)  # FIFO within one priority

    asyncio.run(scenario())


def test_the_daemon_holds_urgent_data_ahead_of_other_data(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b", env={"MESHD_INBOX_CAP": "20"})
    meshd_factory.wait_mesh([a, b])
    import zmq

    ctx: zmq.Context[Any] = zmq.Context()
    stuck = ctx.socket(zmq.DEALER)  # registered, never reads: with a receive HWM of 1 its
    stuck.setsockopt(zmq.LINGER, 0)  # pipe stays full (no room freed in bursts)
    stuck.setsockopt(zmq.RCVHWM, 1)
    stuck.connect(f"ipc://{b.socket}")

    def stats() -> dict[str, Any]:
        return dict(b.query("node")["stats"])

    async def scenario() -> list[Any]:
        await register_raw(stuck, "stuck")
        async with Agent("bulk", socket=a.socket, batch_max=1) as bulk:
            bulk.on_error = lambda err, _id: None  # INBOX_FULL for what bounced: expected
            await wait_listed(bulk, "stuck")
            # until 50 sends in a row bounced: the pipe (and the kernel's socket buffer under it,
            # which takes what ZeroMQ moves on in bursts) is full for good
            refused = 0
            for i in range(20_000):
                await bulk.send("stuck", "job", i, priority=9)
                if i % 50 == 49:
                    await async_wait_until(lambda n=i + 1: stats().get("delivered", 0)
                                           + stats().get("undeliverable_inbox_full", 0) >= n)
                    now = int(stats().get("undeliverable_inbox_full", 0))
                    if now - refused == 50:
                        break
                    refused = now
            else:
                raise AssertionError("the inbox never stayed full")
            await bulk.send("stuck", "job", "urgent", priority=0)
            await async_wait_until(lambda: stats().get("urgent_held", 0) == 1)
            for i in range(5):  # other data bounces while the urgent one waits
                await bulk.send("stuck", "job", f"late{i}", priority=9)
            await async_wait_until(lambda: stats().get("undeliverable_inbox_full", 0) >= 5)

        def drain() -> list[Any]:
            got = []
            while stuck.poll(1000):
                _, hdr, body = stuck.recv_multipart()
                header = msgpack.unpackb(hdr)
                if header["kind"] == "send":
                    got.append((header.get(P.PRIO), msgpack.unpackb(body)))
            return got
        return await asyncio.to_thread(drain)

    try:
        got = asyncio.run(scenario())
    finally:
        stuck.close(0)
        ctx.term()
    payloads = [p for _, p in got]
    assert "urgent" in payloads and (0, "urgent") in got
    before = payloads[:payloads.index("urgent")]
    assert before == sorted(before) and all(isinstance(p, int) for p in before)  # the pipe, FIFO
    assert not [p for p in payloads if isinstance(p, str) and p.startswith("late")] or \
        payloads.index("urgent") < min(payloads.index(p) for p in payloads if str(p).startswith("late"))
    assert stats().get("urgent_delivered", 0) == 1
