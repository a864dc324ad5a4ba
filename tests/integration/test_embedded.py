"""The embedded node (meshd/daemon/embedded.py) beside ordinary daemons: real processes, real sockets,
zeroconf on 127.0.0.1. The embedded process is tests/integration/embedded_agents.py: an agent
with its node in its own process, attached in-process; the daemon is ``meshd run``."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from meshd import Agent, EmbeddedNode
from meshd.errors import DaemonUnreachable
from meshd.testing import (
    MeshdFactory,
    MeshdProcess,
    async_wait_until,
    short_tempdir,
    wait_listed,
    wait_until,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embedded_agents import EmbeddedProcess
from qos_agents import QOS_ENV, Stream, check, count_lines, read_confirmed, read_handled

FAST = ["--interface", "127.0.0.1", "--heartbeat-interval", "0.25", "--stale-after", "1",
        "--offline-after", "2", "--no-http"]


def spawn_embedded(factory: MeshdFactory, name: str, role: list[str], *, secure: bool = False,
                   env: dict[str, str] | None = None, start: bool = True) -> EmbeddedProcess:
    proc = EmbeddedProcess(name, factory.mesh, factory.workdir, FAST, role, secure=secure, env=env)
    factory.procs.append(proc)  # the factory kills it after the test, like its daemons
    return proc.start() if start else proc  # type: ignore[return-value]


def online(proc: MeshdProcess) -> set[str]:
    return {p["node"] for p in proc.query("peers") if p["state"] == "online"}


def lines(path: Path) -> list[Any]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_embedded_and_daemon_discover_each_other_and_talk_both_ways(meshd_factory: MeshdFactory) -> None:
    d = meshd_factory.spawn("d")
    got = meshd_factory.workdir / "emb.jsonl"
    e = spawn_embedded(meshd_factory, "e", ["echo", "--agent", "emb", "--out", str(got)])
    meshd_factory.wait_mesh([d, e])  # zeroconf, HELLO and heartbeats both ways: e is a peer like any
    info = e.query("node")
    assert info["embedded"]["in_process_agents"] == 1 and info["node"] in online(d)

    async def scenario() -> None:
        async with Agent("dmn", socket=d.socket) as me:
            notes: list[Any] = []
            me.on("note")(lambda msg: notes.append(msg.payload))
            me.on("news2")(lambda msg: notes.append(msg.payload))
            me.on("echo")(lambda msg: {"echoed": msg.payload})
            await me.subscribe("news2")
            await wait_listed(me, "emb")
            # daemon -> embedded: request/reply, send, publish
            assert await me.request("emb", "echo", {"n": 1}, timeout=5) == {"n": 1}
            await me.send("emb", "note", {"n": 2})
            await async_wait_until(lambda: len(lines(got)) >= 1, what="the note handled")

            async def reached() -> bool:  # e's subscription reaches d's directory by heartbeat
                return await me.publish("news", {"n": 3}, reach=True) == 1
            await async_wait_until(reached, what="the publication reaching emb")
            await async_wait_until(lambda: ["news", {"n": 3}] in lines(got), what="news handled")
            # embedded -> daemon: request/reply, send, publish (the embedded agent does them)
            result = await me.request("emb", "relay", {"to": "dmn"}, timeout=10)
            assert result == {"reply": {"echoed": {"from": "emb"}}, "reach": 1}
            await async_wait_until(lambda: notes.count({"from": "emb"}) == 2, what="note and news2 from emb")
    asyncio.run(scenario())
    assert ["note", {"n": 2}] in lines(got)


def start_receiver(b: MeshdProcess, out: Path, log: Path) -> subprocess.Popen[bytes]:
    ready = Path(str(out) + ".ready")
    ready.unlink(missing_ok=True)
    with open(log, "ab") as f:
        rx = subprocess.Popen([sys.executable, str(Path(__file__).parent / "qos_agents.py"), "receiver",
                               "--socket", str(b.socket), "--name", "rx", "--out", str(out)],
                              stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    wait_until(lambda: ready.exists() or rx.poll() is not None, 15, what="the receiving agent")
    assert rx.poll() is None, log.read_text()
    return rx


def test_embedded_node_killed_with_units_in_its_outbox_delivers_them_after_restart(
        meshd_factory: MeshdFactory) -> None:
    """kill -9 of the embedded sender's process while its outbox holds confirmed qos-1 units (the
    receiving agent is stopped, then killed too, so what reached it is gone and nothing was acked):
    restarted with its state dir, the embedded node delivers every confirmed message."""
    b = meshd_factory.spawn("b", env=QOS_ENV)
    work = meshd_factory.workdir
    handled, confirmed = work / "handled.txt", work / "confirmed.txt"
    receivers = [start_receiver(b, handled, work / "rx.log")]
    try:
        os.kill(receivers[0].pid, signal.SIGSTOP)  # handles nothing, acks nothing
        e = spawn_embedded(meshd_factory, "e", ["sender", "--name", "tx", "--to", "rx", "--count", "400",
                                                "--out", str(confirmed), "--window", "50"], env=QOS_ENV)
        wait_until(lambda: count_lines(confirmed) >= 200, 30, what="200 confirmed sends", interval=0.01)
        e.kill()  # SIGKILL: the node and its agent die together
        receivers[0].kill()  # and what b handed to the receiver dies with it
        receivers[0].wait(5)
        sent = read_confirmed(confirmed)
        assert len(sent) >= 200 and not read_handled(handled)
        e.role = ["node"]  # the node alone (no new sends): what it delivers is what it stored
        e.start()  # the same state dir: node id, keys and delivery.db
        qos1 = e.query("node")["qos1"]
        stored = qos1["pending"] + qos1["in_flight"]  # units (a batch of sends is one unit)
        assert stored > 0, qos1
        wait_until(lambda: not any(a["name"] == "rx" for a in b.query("agents")), 10, what="rx gone")
        receivers.append(start_receiver(b, handled, work / "rx.log"))
        wait_until(lambda: set(sent) <= set(read_handled(handled)), 60, what="every confirmed send handled",
                   interval=0.1)
        wait_until(lambda: e.query("node")["qos1"]["pending"] == 0 == e.query("node")["qos1"]["in_flight"],
                   30, what="e's outbox to drain")
        runs = read_handled(handled)
        dups = len(runs) - len(set(runs))
        print(f"\n[embedded kill -9 sender] confirmed={len(sent)} units_resumed={stored} "
              f"handled={len(set(runs))} lost={len(set(sent) - set(runs))} dup_delivered={dups}")
        assert set(sent) <= set(runs)
        assert dups == 0  # nothing reached a handler before the kills
    finally:
        for rx in receivers:
            if rx.poll() is None:
                rx.send_signal(signal.SIGCONT)
                rx.terminate()
                rx.wait(5)


def test_embedded_receiver_killed_mid_unit_restarts_and_loses_nothing(meshd_factory: MeshdFactory) -> None:
    """kill -9 of the embedded receiving process from inside its handler (a unit half handled,
    not acked), restarted on its state dir: the daemon's outbox delivers the rest, the embedded
    node's seen-set keeps handled units from running again; nothing is lost."""
    a = meshd_factory.spawn("a", env=QOS_ENV)
    work = meshd_factory.workdir
    role = ["receiver", "--name", "rx", "--out", str(work / "handled.txt")]
    e = spawn_embedded(meshd_factory, "e", [*role, "--kill-at", "505"], env=QOS_ENV)
    meshd_factory.wait_mesh([a, e])
    stream = Stream(a, e, work)  # the sending agent on a; "rx" is e's in-process agent
    try:
        stream.start_sender()
        assert e.proc is not None
        e.proc.wait(30)  # the handler of message 505 kills its own process, node and all
        killed_at = count_lines(stream.recv_out)
        e.role = role
        e.start()
        stats = stream.finish("kill -9 embedded receiving process (mid-unit)")
        print(f"  (killed after {killed_at} handler runs)")
        check(stats, 2000 // 100)
    finally:
        stream.cleanup()


def test_curve_keys_mode_between_embedded_node_and_daemon(meshd_factory: MeshdFactory) -> None:
    d = meshd_factory.spawn("d", secure=True, start=False)
    got = meshd_factory.workdir / "emb.jsonl"
    e = spawn_embedded(meshd_factory, "e", ["echo", "--agent", "emb", "--out", str(got)], secure=True,
                       start=False)
    d.trust(e)
    e.trust(d)
    d.start()
    e.start()
    meshd_factory.wait_mesh([d, e])
    for proc, other in ((d, e), (e, d)):
        info = proc.query("node")
        assert info["insecure"] is False and info["trust_mode"] == "keys"
        assert other.node_id in online(proc)
    peer = next(p for p in d.query("peers") if p["node"] == e.node_id)
    assert peer.get("pubkey", e.public_key) == e.public_key

    async def scenario() -> None:
        async with Agent("dmn", socket=d.socket) as me:
            me.on("echo")(lambda msg: {"echoed": msg.payload})
            me.on("note")(lambda msg: None)
            await wait_listed(me, "emb")
            assert await me.request("emb", "echo", {"curve": True}, timeout=5) == {"curve": True}
            result = await me.request("emb", "relay", {"to": "dmn"}, timeout=10)
            assert result["reply"] == {"echoed": {"from": "emb"}}
    asyncio.run(scenario())


def test_embedded_node_refuses_a_daemon_it_does_not_trust(meshd_factory: MeshdFactory) -> None:
    d = meshd_factory.spawn("d", secure=True, start=False)
    x = meshd_factory.spawn("x", secure=True, start=False)
    e = spawn_embedded(meshd_factory, "e", ["node"], secure=True, start=False)
    d.trust(e)  # one way only: e does not trust d
    x.trust(e)
    e.trust(x)
    for proc in (d, x, e):
        proc.start()
    meshd_factory.wait_mesh([e, x])  # e is a working keys-mode node with the peer it trusts...
    assert d.node_id not in online(e) and e.node_id not in online(d)  # ...and d gets nothing in
    assert e.query("node")["auth"]


def test_an_agent_of_a_stopped_embedded_node_gets_a_typed_error() -> None:
    """A real EmbeddedNode (no discovery, loopback, plaintext): stopped under its agent, the agent's
    next send raises DaemonUnreachable, and a new agent cannot attach."""
    short = short_tempdir()  # ipc socket paths are limited to 107 bytes

    async def run() -> None:
        node = EmbeddedNode.from_config(name="u", mesh=f"t{uuid.uuid4().hex[:12]}", interfaces=["127.0.0.1"],
                                        insecure=True, discovery=False, http=False,
                                        state_dir=short / "state", socket=short / "s.sock",
                                        environ={})
        async with node:
            me = node.agent("solo")
            got: list[Any] = []
            me.on("t")(lambda msg: got.append(msg.payload))
            await me.connect()
            await me.send("solo", "t", {"n": 1})  # to itself, through the node's routing
            await async_wait_until(lambda: got, what="the send handled")
            assert got == [{"n": 1}]
        with pytest.raises(DaemonUnreachable):
            await me.send("solo", "t", {"n": 2})
        with pytest.raises(DaemonUnreachable):
            await node.agent("late").connect()
        await me.close()
    try:
        asyncio.run(run())
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_an_embedded_agents_handler_bound_leaves_the_backlog_in_the_node() -> None:
    """Handler slots on the in-process connection (meshd/client/handler_slots.py): with every slot busy the
    connection stops handing frame sets over, so at most ``max_concurrent_handlers`` run; what a
    frame set already brought waits parked up to ``inbox_cap`` and the rest is refused INBOX_FULL
    (as over ipc): every request answered or refused, none lost."""
    short = short_tempdir()
    bound, n = 2, 400

    async def run() -> tuple[int, int, int, int]:
        node = EmbeddedNode.from_config(name="u", mesh=f"t{uuid.uuid4().hex[:12]}", interfaces=["127.0.0.1"],
                                        insecure=True, discovery=False, http=False, inbox_cap=16,
                                        state_dir=short / "state", socket=short / "s.sock",
                                        environ={})
        running = peak = 0
        async with node:
            slow = node.agent("slow", max_concurrent_handlers=bound)

            @slow.on("work")
            async def work(msg: Any) -> int:
                nonlocal running, peak
                running += 1
                peak = max(peak, running)
                await asyncio.sleep(0.002)
                running -= 1
                return 1

            asker = node.agent("asker", batch_max=1)  # one request per frame set
            await slow.connect()
            await asker.connect()
            results = await asyncio.gather(*(asker.request("slow", "work", {}, timeout=30) for _ in range(n)),
                                           return_exceptions=True)
            await slow.close()
            await asker.close()
            at_client = slow._handler_slots.refused
        answered = sum(1 for r in results if r == 1)
        refused = sum(1 for r in results if getattr(r, "code", None) == "INBOX_FULL")
        return peak, answered, refused, at_client
    try:
        peak, answered, refused, at_client = asyncio.run(run())
    finally:
        shutil.rmtree(short, ignore_errors=True)
    print(f"embedded handler bound {bound}: peak {peak}, {answered} answered, {refused} INBOX_FULL of {n} "
          f"({at_client} refused by the client)")
    assert peak <= bound
    assert answered + refused == n and answered > 0
