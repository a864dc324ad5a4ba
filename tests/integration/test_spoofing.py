"""Spoofed answers between agents are refused, on real daemons through CURVE.

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
from meshd.mesh.keys import load_or_create_node_keys
from meshd.testing import (
    MeshdFactory,
    MeshdProcess,
    async_wait_until,
    raw_agent,
    recv_skipping_pings,
    register_raw,
    wait_listed,
)
from meshd.wire import protocol as P


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
    ctx, raw = raw_agent(b.socket)

    async def scenario() -> None:
        async with Agent("victim", socket=a.socket) as victim, Agent("worker", socket=b.socket) as worker:
            release = asyncio.Event()
            corrs: list[str] = []

            @worker.on("slow")
            async def slow(msg: Any) -> str:
                corrs.append(str(msg.correlation_id))
                await release.wait()
                return "the real answer"

            await register_raw(raw, "mallory")
            await wait_listed(victim, "worker", "mallory")

            # (a) a NAME_TAKEN error to the victim, answering nothing it asked
            forged = {"kind": "error", "id": "f1", "from": "mallory", "to": "victim", "corr": "x1",
                      "error": {"code": "NAME_TAKEN", "message": "you were evicted", "retry": False}}
            raw.send_multipart([P.SIGNATURE, msgpack.packb(forged), b""])
            refused = await asyncio.to_thread(recv_skipping_pings, raw)
            assert refused["kind"] == "error" and refused["error"]["code"] == "VALIDATION_FAILED", refused
            assert refused["corr"] == "f1"

            # (b) a reply with the correlation id of the victim's request to `worker` (the worst
            # case: the attacker learned the id), while the worker is still busy with it
            pending = asyncio.ensure_future(victim.request("worker", "slow", None, timeout=10))
            await async_wait_until(lambda: corrs, what="the worker to get the request")
            assert len(corrs[0]) >= 32  # 128 random bits, not a prefix plus a counter
            reply = {"kind": "reply", "id": "f2", "from": "mallory", "to": "victim", "corr": corrs[0]}
            raw.send_multipart([P.SIGNATURE, msgpack.packb(reply), msgpack.packb("the forged answer")])
            refused = await asyncio.to_thread(recv_skipping_pings, raw)
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
                taken = await asyncio.to_thread(recv_skipping_pings, second)
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


def test_impostor_with_a_peers_node_id_does_not_cut_the_real_peer_off(meshd_factory: MeshdFactory) -> None:
    """A trusted node (c's key) connects to a with b's node id as routing id,
    again and again, and greets as b, while b's agent streams requests to a's agent. Before: the
    impostor took the routing id over (ROUTER_HANDOVER) and 89 of 196 messages were lost with no
    error. Now: routing ids carry a random part, a live one is never handed over, and a HELLO for
    a live peer from another key is refused: 0 lost."""
    a = meshd_factory.spawn("a", secure=True, start=False)
    b = meshd_factory.spawn("b", secure=True, start=False)
    c = meshd_factory.spawn("c", secure=True, start=False)  # never started: its key is the weapon
    a.trust(b, c)
    b.trust(a)
    a.start()
    b.start()
    meshd_factory.wait_mesh([a, b])
    c_keys = load_or_create_node_keys(c.state_dir)
    ctx: zmq.Context[Any] = zmq.Context()
    hello = {"node": b.node_id, "mesh": a.mesh, "proto": P.PROTOCOL_VERSION, "pk": c_keys.public,
             "routers": ["tcp://127.0.0.1:9"], "pubs": [], "incarnation": "impostor", "reply": True,
             "dir": {"version": 1, "agents": []}}

    def impostor(routing_id: bytes) -> None:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, routing_id)
        sock.setsockopt(zmq.CURVE_SERVERKEY, a.public_key.encode())
        sock.setsockopt(zmq.CURVE_PUBLICKEY, c_keys.public.encode())
        sock.setsockopt(zmq.CURVE_SECRETKEY, c_keys.secret.encode())
        sock.connect(a.router)
        sock.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "hello", "from": b.node_id}),
                             msgpack.packb(hello)])
        sock.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "request", "id": "imp", "from": "client",
                                                         "to": "server", "topic": "echo"}), b"\xc0"])
        impostors.append(sock)

    impostors: list[zmq.Socket[Any]] = []
    sent = 200
    lost: list[str] = []

    async def scenario() -> None:
        async with Agent("server", socket=a.socket) as server, Agent("client", socket=b.socket) as client:
            served: list[int] = []

            @server.on("echo")
            async def echo(msg: Any) -> Any:
                served.append(msg.payload)
                return msg.payload

            await wait_listed(client, "server")
            for i in range(sent):
                if i % 20 == 10:  # the plain impostor (routing id = b's node id) and one with a suffix
                    impostor(b.node_id.encode() if i % 40 == 10 else f"{b.node_id}.{i:016x}".encode())
                try:
                    assert await client.request("server", "echo", i, timeout=5) == i
                except Exception as exc:  # counted: messages lost to the impostor
                    lost.append(f"{i}: {exc!r}")
            assert "imp" not in served  # the impostor's own traffic never reached the agent

    try:
        asyncio.run(scenario())
    finally:
        for sock in impostors:
            sock.close(0)
        ctx.term()
    stats = a.query("node")["stats"]
    print(f"impostor: sent={sent} lost={len(lost)} spoofed_hellos_refused="
          f"{stats.get('dropped_spoofed_hello', 0)}")
    assert lost == [], lost
    assert stats.get("dropped_spoofed_hello", 0) >= 1, stats
    assert a.peer_states()[b.node_id] == "online"


def test_a_raising_send_handler_is_a_dead_letter_not_an_answer(meshd_factory: MeshdFactory) -> None:
    """A send handler that raised was reported nowhere. Now the client tells
    its daemon, which keeps a dead letter HANDLER_ERROR (and emits a send outcome with that
    error); the report is never routed to the sender (a send is not answered)."""
    a, b = _two_secure_nodes(meshd_factory)

    async def scenario() -> list[Any]:
        errors: list[Any] = []
        async with Agent("worker", socket=b.socket) as worker, Agent("boss", socket=a.socket) as boss:
            boss.on_error = lambda err, msg_id: errors.append((err.code, msg_id))

            @worker.on("job")
            async def job(msg: Any) -> None:
                raise RuntimeError(f"job {msg.payload} exploded")

            await wait_listed(boss, "worker")
            sent = [await boss.send("worker", "job", n) for n in range(3)]
            await async_wait_until(lambda: b.query("node")["stats"].get("send_handler_errors", 0) >= 3,
                                   what="the three failures to be recorded")
            letters = [d for d in b.dead_letters() if d.get("reason") == "HANDLER_ERROR"]
            assert len(letters) == 3, letters
            assert all("exploded" in str(d.get("detail")) for d in letters), letters
            assert {d.get("header", {}).get("corr") for d in letters} <= set(sent) | {None}
            return errors

    errors = asyncio.run(scenario())
    assert errors == []  # never routed back as an answer to a send
    assert a.query("node")["stats"].get("send_handler_errors", 0) == 0


def test_a_send_with_no_handler_is_a_dead_letter_not_dropped(meshd_factory: MeshdFactory) -> None:
    """A send (qos 0 or 1) on a topic the receiving agent has no handler for was acked and dropped
    in silence (an agent registering handlers after connecting lost its queued units). Now it is
    reported like a raising handler: a dead letter HANDLER_ERROR at the receiver's daemon."""
    a, b = _two_secure_nodes(meshd_factory)

    async def scenario() -> None:
        async with Agent("worker", socket=b.socket) as worker, Agent("boss", socket=a.socket) as boss:
            worker.on("other")(lambda msg: None)
            await wait_listed(boss, "worker")
            sent = [await boss.send("worker", "job", n, qos=n % 2) for n in range(4)]
            await async_wait_until(lambda: b.query("node")["stats"].get("send_handler_errors", 0) >= 4,
                                   what="the four sends to be recorded")
            letters = [d for d in b.dead_letters() if d.get("reason") == "HANDLER_ERROR"]
            assert len(letters) == 4, letters
            assert all("no handler for topic 'job'" in str(d.get("detail")) for d in letters), letters
            assert {d.get("header", {}).get("corr") for d in letters} <= set(sent) | {None}

    asyncio.run(scenario())


def test_an_answer_hidden_in_a_batch_is_refused_or_dropped(meshd_factory: MeshdFactory) -> None:
    """Batches: a forged reply inside a batch is refused by the attacker's daemon when the batch
    header declares it (``kinds``), alone: the batch's other messages go on (a reply that comes
    after its request expired is refused the same way, and must not cost the messages batched
    beside it). When the header does not declare it (the daemon did not decode that batch), the
    victim's client drops it."""
    a, b = _two_secure_nodes(meshd_factory)
    ctx, raw = raw_agent(b.socket)

    async def scenario() -> None:
        async with Agent("victim", socket=a.socket) as victim, Agent("worker", socket=b.socket) as worker:
            release = asyncio.Event()
            corrs: list[str] = []
            sends: list[Any] = []
            victim.on("note")(lambda m: sends.append(m.payload))

            @worker.on("slow")
            async def slow(msg: Any) -> str:
                corrs.append(str(msg.correlation_id))
                await release.wait()
                return "the real answer"

            await register_raw(raw, "mallory")
            await wait_listed(victim, "worker", "mallory")
            pending = asyncio.ensure_future(victim.request("worker", "slow", None, timeout=10))
            await async_wait_until(lambda: corrs, what="the worker to get the request")
            items = [[{"kind": "reply", "id": "f3", "corr": corrs[0]}, msgpack.packb("forged")],
                     [{"kind": "send", "id": "s1", "topic": "note"}, msgpack.packb("hi")]]
            for batch_id, kinds in (("b1", ["reply", "send"]), ("b2", ["send"])):
                raw.send_multipart([P.SIGNATURE, msgpack.packb(
                    {"kind": "batch", "id": batch_id, "from": "mallory", "to": "victim", "count": 2,
                     "kinds": kinds}), msgpack.packb(items)])
            refused = await asyncio.to_thread(recv_skipping_pings, raw)
            # b1, declared: its reply refused by id, alone
            assert refused["error"]["code"] == "VALIDATION_FAILED" and refused["corr"] == "f3", refused
            await async_wait_until(lambda: len(sends) == 2, what="b1's and b2's sends to arrive")
            release.set()
            assert await pending == "the real answer"  # neither forged reply reached the victim
            assert sends == ["hi", "hi"]

    try:
        asyncio.run(scenario())
    finally:
        raw.close(0)
        ctx.term()
