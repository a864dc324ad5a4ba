"""Spoofed answers between agents are refused (issue 8, item 1), on real daemons through CURVE.

The attacker is a raw DEALER on another node, speaking docs/PROTOCOL.md directly: it registers a
name of its own and then sends (a) an ``error`` envelope with code NAME_TAKEN to the victim, which
once made the victim's client mark itself evicted and stop heartbeating, and (b) a ``reply``
carrying the correlation id of a request the victim sent to someone else, which once made the
victim's ``request()`` return the attacker's answer. Both are refused at the attacker's daemon
(VALIDATION_FAILED back to it, counted, dead-lettered) and the victim's client ignores a
state-changing error that does not come from its own daemon.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import zmq

from meshd import Agent
from meshd import protocol as P
from meshd.testing import MeshdFactory, MeshdProcess, async_wait_until, wait_listed


def _recv_skipping_pings(raw: zmq.Socket[Any]) -> dict[str, Any]:
    """Blocking: call in a thread, so the agents' loop keeps running."""
    while True:
        assert raw.poll(5000), "the daemon did not answer"
        _, hdr, _ = raw.recv_multipart()
        header: dict[str, Any] = msgpack.unpackb(hdr)
        if header["kind"] != "ping":
            return header


def _attacker(proc: MeshdProcess) -> tuple[zmq.Context[Any], zmq.Socket[Any]]:
    ctx: zmq.Context[Any] = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(f"ipc://{proc.socket}")
    return ctx, raw


async def _register(raw: zmq.Socket[Any], name: str) -> None:
    raw.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "register", "id": "r"}),
                        msgpack.packb({"name": name})])
    assert (await asyncio.to_thread(_recv_skipping_pings, raw))["kind"] == "ok"


def _two_secure_nodes(meshd_factory: MeshdFactory) -> tuple[MeshdProcess, MeshdProcess]:
    a = meshd_factory.spawn("a", secure=True, start=False)
    b = meshd_factory.spawn("b", secure=True, start=False)
    a.trust(b)
    b.trust(a)
    a.start()
    b.start()
    meshd_factory.wait_mesh([a, b])
    return a, b


def test_forged_name_taken_and_forged_reply_are_refused(meshd_factory: MeshdFactory) -> None:
    a, b = _two_secure_nodes(meshd_factory)
    ctx, raw = _attacker(b)

    async def scenario() -> None:
        async with Agent("victim", socket=a.socket) as victim, Agent("worker", socket=b.socket) as worker:
            release = asyncio.Event()
            corrs: list[str] = []

            @worker.on("slow")
            async def slow(msg: Any) -> str:
                corrs.append(str(msg.correlation_id))
                await release.wait()
                return "the real answer"

            await _register(raw, "mallory")
            await wait_listed(victim, "worker", "mallory")

            # (a) a NAME_TAKEN error to the victim, answering nothing it asked
            forged = {"kind": "error", "id": "f1", "from": "mallory", "to": "victim", "corr": "x1",
                      "error": {"code": "NAME_TAKEN", "message": "you were evicted", "retry": False}}
            raw.send_multipart([P.SIGNATURE, msgpack.packb(forged), b""])
            refused = await asyncio.to_thread(_recv_skipping_pings, raw)
            assert refused["kind"] == "error" and refused["error"]["code"] == "VALIDATION_FAILED", refused
            assert refused["corr"] == "f1"

            # (b) a reply with the correlation id of the victim's request to `worker` (the worst
            # case: the attacker learned the id), while the worker is still busy with it
            pending = asyncio.ensure_future(victim.request("worker", "slow", None, timeout=10))
            await async_wait_until(lambda: corrs, what="the worker to get the request")
            assert len(corrs[0]) >= 32  # 128 random bits, not a prefix plus a counter
            reply = {"kind": "reply", "id": "f2", "from": "mallory", "to": "victim", "corr": corrs[0]}
            raw.send_multipart([P.SIGNATURE, msgpack.packb(reply), msgpack.packb("the forged answer")])
            refused = await asyncio.to_thread(_recv_skipping_pings, raw)
            assert refused["error"]["code"] == "VALIDATION_FAILED" and refused["corr"] == "f2", refused
            release.set()
            assert await pending == "the real answer"

            # the victim kept its name and goes on working; the attacker cannot take the name
            assert victim.evicted is None
            assert await victim.request("worker", "slow", None, timeout=10) == "the real answer"
            second = ctx.socket(zmq.DEALER)
            second.setsockopt(zmq.LINGER, 0)
            second.connect(f"ipc://{b.socket}")
            try:
                second.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "register", "id": "r2"}),
                                       msgpack.packb({"name": "victim"})])
                taken = await asyncio.to_thread(_recv_skipping_pings, second)
            finally:
                second.close(0)
            assert taken["kind"] == "error" and taken["error"]["code"] == "NAME_TAKEN", taken

    try:
        asyncio.run(scenario())
    finally:
        raw.close(0)
        ctx.term()
    stats = b.query("node")["stats"]
    assert stats.get("refused_forged_answer", 0) == 2, stats
    reasons = [d.get("reason") for d in b.dead_letters()]
    assert reasons.count("forged_answer") == 2, reasons
    print(f"forged answers refused at the attacker's daemon: {stats['refused_forged_answer']}")


def test_client_ignores_name_taken_not_from_its_own_daemon(meshd_factory: MeshdFactory) -> None:
    """Defence in depth: even if a forged NAME_TAKEN reaches the client (a hostile daemon), the
    client does not give up its name; its own daemon's word still counts."""
    a = meshd_factory.spawn("a")

    async def scenario() -> None:
        async with Agent("victim", socket=a.socket) as victim:
            victim._on_error({"kind": "error", "from": "mallory", "corr": "zz",
                              "error": {"code": "NAME_TAKEN", "message": "evicted", "retry": False}})
            victim._on_error({"kind": "error", "from": "meshd@someone-else", "corr": "zz",
                              "error": {"code": "NAME_TAKEN", "message": "evicted", "retry": False}})
            assert victim.evicted is None and victim.forged_errors == 2
            assert await victim.agents()  # still working
            victim._on_error({"kind": "error", "from": f"meshd@{victim.node}",
                              "error": {"code": "NAME_TAKEN", "message": "evicted", "retry": False}})
            assert victim.evicted is not None

    asyncio.run(scenario())
