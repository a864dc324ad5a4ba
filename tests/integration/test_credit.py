"""Credit mode on the agent link (docs/PROTOCOL.md §8.11), on real daemons: a crediting agent's
pipe holds at most its window of data, the rest of its inbox waits in the daemon by priority
(counted, not timed); the inbox bound gives INBOX_FULL; qos 1 loses nothing; a client that does
not ask for credit gets the previous behaviour."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest

from meshd import Agent, InboxFull
from meshd.testing import MeshdFactory, async_wait_until, raw_agent, recv_skipping_pings, wait_listed
from meshd.wire import protocol as P


def _register(sock: Any, name: str, credit: Any) -> dict[str, Any]:
    """Register on a raw connection (blocking: call in a thread); the answer's header and body."""
    body: dict[str, Any] = {"name": name}
    if credit is not None:
        body["credit"] = credit
    sock.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "register", "id": "r"}), msgpack.packb(body)])
    while True:
        assert sock.poll(5000), "the daemon did not answer"
        _, hdr, raw = sock.recv_multipart()
        header = msgpack.unpackb(hdr)
        if header["kind"] != "ping":
            return {"header": header, "body": msgpack.unpackb(raw) if raw else None}


def _read_sends(sock: Any, n: int, grant_every: int | None) -> list[tuple[int | None, Any]]:
    """Read ``n`` sends (blocking), granting credit every ``grant_every`` read."""
    got: list[tuple[int | None, Any]] = []
    while len(got) < n:
        assert sock.poll(5000), f"only {len(got)} of {n} sends came"
        _, hdr, body = sock.recv_multipart()
        header = msgpack.unpackb(hdr)
        if header["kind"] != "send":
            continue
        got.append((header.get(P.PRIO), msgpack.unpackb(body)))
        if grant_every and len(got) % grant_every == 0:
            sock.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "credit", "read": len(got)}), b""])
    return got


def test_a_crediting_agent_gets_its_backlog_by_priority(meshd_factory: MeshdFactory) -> None:
    d = meshd_factory.spawn("d", env={"MESHD_INBOX_CAP": "40"})
    ctx, sock = raw_agent(d.socket)

    def stats() -> dict[str, Any]:
        return dict(d.query("node")["stats"])

    async def scenario() -> list[tuple[int | None, Any]]:
        answer = await asyncio.to_thread(_register, sock, "slow", 4)
        assert answer["header"]["kind"] == "ok" and answer["body"]["credit"] == 4
        async with Agent("bulk", socket=d.socket, batch_max=1) as bulk:
            await wait_listed(bulk, "slow")
            for i in range(30):
                await bulk.send("slow", "job", ("p9", i), priority=9)
            for i in range(5):
                await bulk.send("slow", "job", ("p0", i), priority=0)
            for i in range(3):
                await bulk.send("slow", "job", ("p5", i))
            # nothing read yet: the window (4) went into the pipe, the other 34 wait in the daemon
            await async_wait_until(lambda: stats().get("credit_held", 0) == 34)
            return await asyncio.to_thread(_read_sends, sock, 38, 2)

    try:
        got = asyncio.run(scenario())
    finally:
        sock.close(0)
        ctx.term()
    payloads = [tuple(p) for _, p in got]
    assert payloads[:4] == [("p9", i) for i in range(4)]  # the window, written before the rest came
    assert payloads[4:9] == [("p0", i) for i in range(5)]
    assert payloads[9:12] == [("p5", i) for i in range(3)]
    assert payloads[12:] == [("p9", i) for i in range(4, 30)]


def test_the_inbox_bound_and_the_credit_range(meshd_factory: MeshdFactory) -> None:
    d = meshd_factory.spawn("d", env={"MESHD_INBOX_CAP": "10"})
    ctx, sock = raw_agent(d.socket)
    bad_ctx, bad = raw_agent(d.socket)

    async def scenario() -> None:
        for credit in (0, -1, P.MAX_CREDIT + 1, 2.5, True, "8"):
            answer = await asyncio.to_thread(_register, bad, "bad", credit)
            assert answer["header"]["kind"] == "error"
            assert answer["header"]["error"]["code"] == P.ErrorCode.VALIDATION_FAILED
        assert (await asyncio.to_thread(_register, sock, "full", 2))["body"]["credit"] == 2
        async with Agent("bulk", socket=d.socket, batch_max=1) as bulk:
            refused: list[str] = []
            bulk.on_error = lambda err, _id: refused.append(err.code)
            await wait_listed(bulk, "full")
            for i in range(12):  # 2 in the pipe, 10 in the daemon: all taken
                await bulk.send("full", "job", i, priority=9)
            await async_wait_until(lambda: d.query("node")["stats"].get("credit_held", 0) == 10)
            with pytest.raises(InboxFull):
                await bulk.request("full", "job", "one too many", priority=9, timeout=10)
            await bulk.send("full", "job", "refused too", priority=9)
            await async_wait_until(lambda: refused == [P.ErrorCode.INBOX_FULL])
            # urgent data has priority_hold_max more room, as without credit: it waits, first
            await bulk.send("full", "job", "urgent", priority=0)
            await async_wait_until(lambda: d.query("node")["stats"].get("credit_held", 0) == 11)
            assert refused == [P.ErrorCode.INBOX_FULL]
        got = await asyncio.to_thread(_read_sends, sock, 13, 1)
        assert [p for _, p in got] == [0, 1, "urgent", *range(2, 12)]

    try:
        asyncio.run(scenario())
    finally:
        sock.close(0)
        bad.close(0)
        ctx.term()
        bad_ctx.term()


def test_a_client_without_credit_keeps_the_pipe(meshd_factory: MeshdFactory) -> None:
    d = meshd_factory.spawn("d", env={"MESHD_INBOX_CAP": "10"})
    ctx, sock = raw_agent(d.socket)

    async def scenario() -> None:
        answer = await asyncio.to_thread(_register, sock, "old", None)
        assert answer["header"]["kind"] == "ok" and "credit" not in answer["body"]
        async with Agent("bulk", socket=d.socket, batch_max=1) as bulk:
            await wait_listed(bulk, "old")
            for i in range(8):
                await bulk.send("old", "job", i, priority=9 if i < 4 else 0)
            # written into the pipe at once (nothing held), in the order sent, and read without credit
            got = await asyncio.to_thread(_read_sends, sock, 8, None)
            assert [p for _, p in got] == list(range(8))
            assert d.query("node")["stats"].get("credit_held", 0) == 0
            answer_hdr = await asyncio.to_thread(_ping_query, sock)
            assert answer_hdr["kind"] == "ok"

    try:
        asyncio.run(scenario())
    finally:
        sock.close(0)
        ctx.term()


def _ping_query(sock: Any) -> dict[str, Any]:
    sock.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "query", "id": "q", "what": "node"}), b""])
    return recv_skipping_pings(sock)


def test_qos1_loses_nothing_through_the_credit_hold(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b", env={"MESHD_INBOX_CAP": "10"})
    meshd_factory.wait_mesh([a, b])

    async def scenario() -> None:
        async with Agent("worker", socket=b.socket, max_concurrent_handlers=1) as worker, \
                Agent("sender", socket=a.socket) as sender:
            gate = asyncio.Event()
            seen: list[Any] = []

            @worker.on("job")
            async def job(msg: Any) -> None:
                if not gate.is_set():
                    await gate.wait()
                seen.append(msg.payload)

            await wait_listed(sender, "worker")
            n = 300  # far more than the worker's parked work, its window and its inbox take
            for i in range(n):
                await asyncio.wait_for(sender.send("worker", "job", i, qos=1, priority=i % 10), 30)
            await async_wait_until(lambda: b.query("node")["stats"].get("credit_refused", 0) > 0
                                   or b.query("node")["stats"].get("undeliverable_inbox_full", 0) > 0,
                                   timeout=30)
            gate.set()
            await async_wait_until(lambda: len(set(seen)) == n, timeout=60)
            assert sorted(set(seen)) == list(range(n))

    asyncio.run(scenario())
