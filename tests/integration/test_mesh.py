"""Real daemons on 127.0.0.1 (real zeroconf, real sockets): discovery, primitives, failures."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from typing import Any

import msgpack
import pytest
import zmq

from meshd import Agent, HandlerError, NameTaken, NoSuchAgent
from meshd.testing import MeshdFactory, async_wait_until, wait_listed, wait_until
from meshd.wire import protocol as P


def agent_names(proc: Any) -> set[str]:
    return {a["name"] for a in proc.query("agents")}


def test_discovery_both_ways(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    t0 = time.monotonic()
    meshd_factory.wait_mesh([a, b])
    print(f"mesh formed {time.monotonic() - t0:.3f} s after b was ready")
    peers_a = {p["node"]: p for p in a.query("peers")}
    assert peers_a[b.node_id]["name"] == "b" and peers_a[b.node_id]["source"] == "mdns"
    assert a.node_id in {p["node"] for p in b.query("peers")}


def test_send_request_publish_across_daemons(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])

    async def scenario() -> None:
        async with Agent("planner", socket=a.socket) as planner, \
                Agent("researcher", socket=b.socket, capabilities=["search"]) as researcher:
            got: asyncio.Queue[Any] = asyncio.Queue()

            @researcher.on("verify")
            async def verify(msg: Any) -> Any:
                return {"ok": True, "claim": msg.payload["claim"], "from": msg.sender}

            @researcher.on("note")
            def note(msg: Any) -> None:
                got.put_nowait(msg)

            await wait_listed(planner, "researcher")
            reply = await planner.request("researcher", "verify", {"claim": "x"}, timeout=5)
            assert reply == {"ok": True, "claim": "x", "from": "planner"}
            # name@node addressing
            reply = await planner.request(f"researcher@{b.node_id}", "verify", {"claim": "y"}, timeout=5)
            assert reply["claim"] == "y"

            await planner.send("researcher", "note", {"n": 1})
            msg = await asyncio.wait_for(got.get(), 5)
            assert (msg.sender, msg.topic, msg.payload, msg.kind) == ("planner", "note", {"n": 1}, "send")

            # many sends arrive in order (FIFO per sender/receiver pair), through batching
            for i in range(500):
                await planner.send("researcher", "note", {"n": i})
            seen = [(await asyncio.wait_for(got.get(), 5)).payload["n"] for _ in range(500)]
            assert seen == list(range(500))

            # pub/sub across daemons, exact topic match, publish counts subscribers
            await planner.subscribe("findings")
            await planner.subscribe("findings")  # idempotent
            topics: asyncio.Queue[Any] = asyncio.Queue()
            planner.on("findings")(lambda m: topics.put_nowait(m))
            await async_wait_until(lambda: researcher_sees_subscriber(researcher, "findings"))
            assert await researcher.publish("findings", {"f": 1}, reach=True) == 1
            assert await researcher.publish("findings-other", {"f": 2}, reach=True) == 0
            m = await asyncio.wait_for(topics.get(), 5)
            assert (m.kind, m.topic, m.payload, m.sender) == ("publish", "findings", {"f": 1}, "researcher")
            await planner.unsubscribe("findings")
            await planner.unsubscribe("findings")
            await async_wait_until(lambda: researcher_sees_subscriber(researcher, "findings", 0))
            assert await researcher.publish("findings", {"f": 3}, reach=True) == 0

    asyncio.run(scenario())


async def researcher_sees_subscriber(agent: Agent, topic: str, count: int = 1) -> bool:
    n = sum(1 for a in await agent.agents() if topic in (a.get("topics") or []))
    return n == count


def test_unknown_agent_fails_fast_and_handler_errors_come_back(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])

    async def scenario() -> None:
        async with Agent("asker", socket=a.socket) as asker, Agent("worker", socket=b.socket) as worker:
            @worker.on("boom")
            def boom(msg: Any) -> Any:
                raise KeyError("no such key")

            @worker.on("fine")
            def fine(msg: Any) -> Any:
                return "still serving"

            @worker.on("verbose")
            def verbose(msg: Any) -> Any:  # a message larger than the 8 KiB header cap
                raise ValueError("x" * 50_000)

            t0 = time.monotonic()
            with pytest.raises(NoSuchAgent):
                await asker.request("nobody", "x", {}, timeout=30)
            assert time.monotonic() - t0 < 5, "NO_SUCH_AGENT must come back at once, not at the timeout"
            await wait_listed(asker, "worker")
            with pytest.raises(HandlerError) as info:
                await asker.request("worker", "boom", {}, timeout=5)
            assert info.value.remote_type == "KeyError" and "no such key" in info.value.message
            assert await asker.request("worker", "fine", {}, timeout=5) == "still serving"
            with pytest.raises(HandlerError) as info:  # bounded, not lost to the header cap
                await asker.request("worker", "verbose", {}, timeout=5)
            assert info.value.remote_type == "ValueError" and 100 < len(info.value.message) <= 500
            with pytest.raises(HandlerError, match="no handler"):
                await asker.request("worker", "unhandled-topic", {}, timeout=5)
            # a send to an unknown agent is reported through on_error
            errors: list[Any] = []
            asker.on_error = lambda err, corr: errors.append(err)
            await asker.send("nobody", "x", {})
            await async_wait_until(lambda: errors)
            assert isinstance(errors[0], NoSuchAgent)

    asyncio.run(scenario())


def test_duplicate_name_refused_anywhere_in_the_mesh(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])

    async def scenario() -> None:
        async with Agent("unique", socket=a.socket) as first:
            with pytest.raises(NameTaken, match="this node"):
                async with Agent("unique", socket=a.socket):
                    pass
            await wait_listed(first, "unique")
            wait_until(lambda: "unique" in agent_names(b))
            with pytest.raises(NameTaken, match=a.node_id):
                async with Agent("unique", socket=b.socket):
                    pass
        # released when the holder leaves
        wait_until(lambda: "unique" not in agent_names(b))
        async with Agent("unique", socket=b.socket):
            pass

    asyncio.run(scenario())


def test_kill_9_takes_daemon_offline_and_removes_its_agents(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    ctl = subprocess.Popen([sys.executable, "-c", "from meshd.cli import meshctl_main; meshctl_main()",
                            "--socket", str(b.socket), "agent", "victim"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: "victim" in agent_names(a), what="victim listed at a")
        b_id = b.node_id
        b.kill()
        t0 = time.monotonic()
        wait_until(lambda: a.peer_states().get(b_id) in ("stale", "offline"), what="b stale at a")
        print(f"stale after {time.monotonic() - t0:.3f} s")
        wait_until(lambda: a.peer_states().get(b_id) == "offline", what="b offline at a")
        print(f"offline after {time.monotonic() - t0:.3f} s")
        assert "victim" not in agent_names(a)
    finally:
        ctl.kill()
        ctl.wait(5)


def test_agent_process_killed_is_removed_everywhere(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    ctl = subprocess.Popen([sys.executable, "-c", "from meshd.cli import meshctl_main; meshctl_main()",
                            "--socket", str(b.socket), "agent", "short-lived"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: "short-lived" in agent_names(a), what="agent listed at a")
        ctl.send_signal(signal.SIGKILL)
        ctl.wait(5)
        t0 = time.monotonic()
        wait_until(lambda: "short-lived" not in agent_names(b), what="agent gone at b")
        wait_until(lambda: "short-lived" not in agent_names(a), what="agent gone at a")
        print(f"killed agent removed everywhere in {time.monotonic() - t0:.3f} s")
    finally:
        if ctl.poll() is None:
            ctl.kill()


def test_static_peers_and_gossip_without_mdns(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a", "--no-discovery")
    b = meshd_factory.spawn("b", "--no-discovery", "--peer", a.router)
    c = meshd_factory.spawn("c", "--no-discovery", "--peer", a.router)
    # c was only told about a; it learns b (and b learns c) through gossip
    meshd_factory.wait_mesh([a, b, c])
    sources = {p["node"]: p["source"] for p in c.query("peers")}
    assert sources[a.node_id] == "static"
    assert sources[b.node_id] == "gossip"

    async def scenario() -> None:
        async with Agent("echo", socket=b.socket) as echo, Agent("caller", socket=c.socket) as caller:
            echo.on("ping")(lambda m: m.payload)
            await wait_listed(caller, "echo")
            assert await caller.request("echo", "ping", [1, 2], timeout=5) == [1, 2]

    asyncio.run(scenario())


def test_other_mesh_is_ignored(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    stranger = meshd_factory.spawn("x", mesh=meshd_factory.mesh + "-other")
    b = meshd_factory.spawn("b")  # started after the stranger: once a sees b, it had time to see x
    meshd_factory.wait_mesh([a, b])
    assert stranger.node_id not in a.peer_states()
    assert a.node_id not in stranger.peer_states()
    # even a static HELLO from another mesh is refused
    c = meshd_factory.spawn("c", "--no-discovery", "--peer", a.router, mesh=meshd_factory.mesh + "-other")
    wait_until(lambda: a.info() and a.query("node")["stats"].get("other_mesh", 0) > 0, what="refusal")
    assert c.node_id not in a.peer_states()


def test_malformed_frames_counted_and_daemon_keeps_serving(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    ctx = zmq.Context()
    bad_peer = ctx.socket(zmq.DEALER)
    bad_peer.setsockopt(zmq.LINGER, 0)
    bad_peer.setsockopt(zmq.ROUTING_ID, b"intruder00000000")
    bad_peer.connect(a.router)
    bad_agent = ctx.socket(zmq.DEALER)
    bad_agent.setsockopt(zmq.LINGER, 0)
    bad_agent.connect(f"ipc://{a.socket}")
    garbage = [
        [b"hello"],
        [b"NOPE", b"x", b"y"],
        [b"MSH\x09", msgpack.packb({"kind": "send"}), b""],
        [P.SIGNATURE, b"\xc1\xc1\xc1", b""],
        [P.SIGNATURE, msgpack.packb([1, 2, 3]), b""],
        [P.SIGNATURE, msgpack.packb({"kind": "teleport"}), b""],
        [P.SIGNATURE, msgpack.packb({"kind": "hello"}), b"\xff\xfe"],
        [P.SIGNATURE, msgpack.packb({"kind": "send", "to": "x", "from": "y"}), b""],  # no HELLO first
    ]
    try:
        for frames in garbage:
            bad_peer.send_multipart(frames)
            bad_agent.send_multipart(frames)
        stats = wait_until(lambda: (s := a.query("node")["stats"]).get("malformed", 0) >= 12 and s,
                           what="malformed frames counted")
        assert stats.get("dropped_before_hello", 0) >= 1
        assert a.query("node")["dead_letters"] >= 12
        assert a.alive()

        async def still_serving() -> None:
            async with Agent("svc", socket=b.socket) as svc, Agent("cli", socket=a.socket) as cli:
                svc.on("ok")(lambda m: "fine")
                await wait_listed(cli, "svc")
                assert await cli.request("svc", "ok", None, timeout=5) == "fine"

        asyncio.run(still_serving())
    finally:
        bad_peer.close(0)
        bad_agent.close(0)
        ctx.term()


def test_sigterm_says_goodbye_and_exits_zero(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a", fast=False)  # default liveness: only the goodbye can be this quick
    b = meshd_factory.spawn("b", fast=False)
    meshd_factory.wait_mesh([a, b])
    b_id = b.node_id
    t0 = time.monotonic()
    assert b.stop() == 0
    wait_until(lambda: a.peer_states().get(b_id) == "offline", timeout=6, what="b offline at a")
    print(f"b offline at a {time.monotonic() - t0:.3f} s after SIGTERM")
    assert not b.socket.exists()


def test_restart_with_same_node_id_is_the_same_peer(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    b_id = b.node_id
    b.kill()
    wait_until(lambda: a.peer_states().get(b_id) in ("stale", "offline"), what="b down")
    b.start()
    assert b.node_id == b_id
    meshd_factory.wait_mesh([a, b])
    assert list(a.peer_states()) == [b_id]  # no ghost twin


def test_agent_that_stops_heartbeating_goes_stale_everywhere(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    ctx = zmq.Context()
    quiet = ctx.socket(zmq.DEALER)  # registers, then never heartbeats
    quiet.setsockopt(zmq.LINGER, 0)
    quiet.connect(f"ipc://{b.socket}")
    try:
        quiet.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "register", "id": "r"}),
                              msgpack.packb({"name": "quiet"})])
        assert quiet.poll(5000)

        def state_at_a() -> str | None:
            return next((x["state"] for x in a.query("agents") if x["name"] == "quiet"), None)
        wait_until(lambda: state_at_a() == "online", what="quiet online at a")
        wait_until(lambda: state_at_a() == "stale", what="quiet stale at a (1 s without heartbeat)")
        wait_until(lambda: state_at_a() is None, what="quiet removed at a (2 s without heartbeat)")
    finally:
        quiet.close(0)
        ctx.term()
