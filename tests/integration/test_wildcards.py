"""Wildcard subscriptions on real daemons: every form, local and remote publishers, durable
subscribers, each publication once however many patterns match, and the bounds."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from meshd import Agent, TooLarge, ValidationFailed
from meshd.testing import MeshdFactory, async_wait_until

CTL = [sys.executable, "-c", "import sys; from meshd.cli import meshctl_main; sys.exit(meshctl_main())"]
PATTERNS = ["results.*", "results.>", "*.errors", "results.x"]  # "results.x": exact, overlapping
# topic -> does the subscriber of PATTERNS take it
TOPICS = {"results.x": True, "results.y": True, "results.x.y": True, "results": False,
          "db.errors": True, "db.errors.z": False, "other": False, "resultsx.y": False}


async def sees(agent: Agent, name: str, topics: list[str], durable: list[str] | None = None) -> bool:
    recs = {r["name"]: r for r in await agent.agents()}
    rec = recs.get(name)
    return rec is not None and set(topics) <= set(rec.get("topics") or []) and \
        set(durable or []) <= set(rec.get("durable") or [])


def fenced(got: list[tuple[str, Any]], fence: asyncio.Event) -> Any:
    def on(msg: Any) -> None:
        if msg.topic == "fence":
            fence.set()
        else:
            got.append((msg.topic, msg.payload))
    return on


def test_every_form_from_local_and_remote_publishers_once(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])

    async def scenario() -> None:
        async with Agent("sub", socket=b.socket) as sub, Agent("near", socket=b.socket) as near, \
                Agent("far", socket=a.socket) as far:
            got: list[tuple[str, Any]] = []
            fence = asyncio.Event()
            sub.on()(fenced(got, fence))
            for p in [*PATTERNS, "fence"]:
                await sub.subscribe(p)
            await async_wait_until(lambda: sees(far, "sub", [*PATTERNS, "fence"]))
            expected = sorted(t for t, hit in TOPICS.items() if hit)
            for publisher in (near, far):  # b's own agent, then one on a (filtered at a)
                got.clear()
                fence.clear()
                for topic, hit in TOPICS.items():
                    reached = await publisher.publish(topic, {"by": publisher.name}, reach=True)
                    assert reached == (1 if hit else 0), (publisher.name, topic, reached)
                await publisher.publish("fence", reach=True)  # FIFO per publisher: all came before
                await asyncio.wait_for(fence.wait(), 10)
                assert sorted(t for t, _ in got) == expected, publisher.name  # once each, no more
                assert all(p == {"by": publisher.name} for _, p in got)
            # the publisher's daemon decides from the directory: once the pattern is gone there
            await sub.unsubscribe("*.errors")
            await async_wait_until(lambda: not_sees(far, "sub", "*.errors"))
            assert await far.publish("db.errors", reach=True) == 0
            assert await far.publish("results.z", reach=True) == 1

    asyncio.run(scenario())


async def not_sees(agent: Agent, name: str, topic: str) -> bool:
    recs = {r["name"]: r for r in await agent.agents()}
    return topic not in (recs.get(name, {}).get("topics") or [])


def test_handlers_by_pattern_and_pattern_publish_refused(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")

    async def scenario() -> None:
        async with Agent("sub", socket=a.socket) as sub, Agent("pub", socket=a.socket) as pub:
            one: list[str] = []
            rest: list[str] = []
            sub.on("results.*")(lambda m: one.append(m.topic))
            sub.on("results.>")(lambda m: rest.append(m.topic))
            await sub.subscribe("results.>")
            for t in ("results.a", "results.a.b"):
                assert await pub.publish(t, reach=True) == 1
            await async_wait_until(lambda: len(one) + len(rest) == 2)
            assert (one, rest) == (["results.a"], ["results.a.b"])  # first matching handler
            with pytest.raises(ValidationFailed):
                await pub.publish("results.*")  # a wildcard is for subscriptions
            with pytest.raises(ValidationFailed):
                await sub.subscribe("a.>.b")
            with pytest.raises(ValidationFailed):
                await sub.subscribe("a..*")

    asyncio.run(scenario())


def test_durable_patterns_get_one_copy_each(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    c = meshd_factory.spawn("c")
    meshd_factory.wait_mesh([a, b, c])

    async def scenario() -> None:
        async with Agent("pub", socket=a.socket) as pub, Agent("keeper", socket=b.socket) as keeper, \
                Agent("home", socket=a.socket) as home, Agent("glance", socket=c.socket) as glance:
            kept: list[tuple[str, Any]] = []
            homed: list[tuple[str, Any]] = []
            glanced: list[tuple[str, Any]] = []
            fences = {n: asyncio.Event() for n in ("keeper", "home", "glance")}
            keeper.on()(fenced(kept, fences["keeper"]))
            home.on()(fenced(homed, fences["home"]))
            glance.on()(fenced(glanced, fences["glance"]))
            # durable by a pattern, plus an ordinary pattern that also matches: still one copy
            for ag in (keeper, home):
                await ag.subscribe("ledger.>", durable=True)
                await ag.subscribe("ledger.*")
                await ag.subscribe("fence")
            await glance.subscribe("*.eu")
            await glance.subscribe("fence")
            await async_wait_until(lambda: sees(pub, "keeper", ["ledger.*", "fence"], ["ledger.>"]))
            await async_wait_until(lambda: sees(pub, "glance", ["*.eu", "fence"]))
            await async_wait_until(lambda: sees(pub, "home", ["ledger.*", "fence"], ["ledger.>"]))
            topics = [f"ledger.{i}" if i % 3 else f"ledger.{i}.eu" for i in range(30)] + ["ledger.eu"]
            counts = [await pub.publish(t, {"i": i}, qos=1, reach=True) for i, t in enumerate(topics)]
            # keeper and home durably, glance for "ledger.eu" (matches "*.eu")
            assert counts == [2] * 30 + [3]
            await async_wait_until(lambda: len(kept) >= 31 and len(homed) >= 31)
            # the fence follows every PUB/SUB copy: a wrong second copy would have come before it
            assert await pub.publish("fence", reach=True) == 3
            for ev in fences.values():
                await asyncio.wait_for(ev.wait(), 10)
            assert sorted(t for t, _ in kept) == sorted(topics)
            assert sorted(t for t, _ in homed) == sorted(topics)
            assert [t for t, _ in glanced] == ["ledger.eu"]

    asyncio.run(scenario())


def test_bounds_are_config_keys_with_typed_errors(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a", env={"MESHD_MAX_PATTERNS_PER_AGENT": "2", "MESHD_MAX_PATTERN_TOKENS": "3"})

    async def scenario() -> None:
        async with Agent("sub", socket=a.socket) as sub:
            await sub.subscribe("a.*")
            await sub.subscribe("b.>")
            await sub.subscribe("b.>")  # idempotent: not a third
            await sub.subscribe("exact.topic")  # exact topics are not patterns
            with pytest.raises(TooLarge, match="max_patterns_per_agent=2"):
                await sub.subscribe("c.*")
            await sub.unsubscribe("a.*")
            with pytest.raises(TooLarge, match="max_pattern_tokens=3"):
                await sub.subscribe("a.b.c.*")
            await sub.subscribe("a.b.*")
        stats = a.query("node").get("stats", {})
        assert stats.get("refused_directory_bound", 0) >= 2

    asyncio.run(scenario())


def test_meshctl_tail_takes_a_pattern(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    tail = subprocess.Popen([*CTL, "--socket", str(b.socket),
                             "--as", "tailer", "tail", "results.>"],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        async def scenario() -> None:
            async with Agent("pub", socket=a.socket) as pub:
                await async_wait_until(lambda: sees(pub, "tailer", ["results.>"]))
                assert await pub.publish("results.summarizer", {"n": 1}, reach=True) == 1
                assert await pub.publish("other", {"n": 2}, reach=True) == 0
        asyncio.run(scenario())
        assert tail.stdout is not None
        line = json.loads(tail.stdout.readline())
        assert (line["topic"], line["payload"]) == ("results.summarizer", {"n": 1})
    finally:
        tail.terminate()
        tail.wait(10)
