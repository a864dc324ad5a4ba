"""Directory changes travel as deltas; the full directory only on greeting and resync (a full
list per change once sent hundreds of MB to one peer for one agent's 10,000 subscriptions).
Real daemons on 127.0.0.1."""

from __future__ import annotations

import asyncio
from typing import Any

from meshd import Agent
from meshd.testing import MeshdFactory, MeshdProcess, async_wait_until, wait_listed


def _dir_stats(proc: MeshdProcess) -> dict[str, int]:
    stats = proc.query("node").get("stats", {})
    return {k: int(v) for k, v in stats.items() if k.startswith("dir")}


async def _sees_topics(asker: Agent, name: str, topics: set[str]) -> bool:
    for rec in await asker.agents():
        if rec["name"] == name:
            return topics <= set(rec.get("topics") or ())
    return False


def test_thousands_of_subscriptions_cost_deltas_not_directories(meshd_factory: MeshdFactory) -> None:
    """One agent subscribes to 2,500 topics one by one: the peer's view converges (a publication
    from it on the last topic reaches the agent), no full directory is sent meanwhile, and the
    directory bytes sent are of the order of the topics themselves (the whole directory each time
    would be about 1,250 times as much)."""
    n = 2500
    env = {"MESHD_MAX_SUBSCRIPTIONS_PER_AGENT": str(n)}
    # Default liveness timings: a busy machine must not make peers re-greet (a HELLO is a full send).
    a = meshd_factory.spawn("a", env=env, fast=False)
    b = meshd_factory.spawn("b", env=env, fast=False)
    meshd_factory.wait_mesh([a, b], timeout=30)
    topics = [f"topic.{i:05d}.{'x' * 20}" for i in range(n)]
    topic_bytes = sum(len(t) for t in topics)

    async def scenario() -> tuple[dict[str, int], dict[str, int], Any]:
        async with Agent("hoarder", socket=a.socket) as hoarder, Agent("pub", socket=b.socket) as pub:
            got: asyncio.Queue[Any] = asyncio.Queue()
            hoarder.on(topics[-1])(lambda m: got.put_nowait(m.payload))
            await wait_listed(pub, "hoarder")
            before = await asyncio.to_thread(_dir_stats, a)
            for topic in topics:  # a plain awaited loop: one change per loop turn of the daemon
                await hoarder.subscribe(topic)
            await async_wait_until(lambda: pub.publish(topics[-1], {"last": True}, reach=True),
                                   timeout=30, what="b's view of hoarder's last topic")
            payload = await asyncio.wait_for(got.get(), 10)
            assert await _sees_topics(pub, "hoarder", set(topics))
            after = await asyncio.to_thread(_dir_stats, a)
        return before, after, payload

    before, after, payload = asyncio.run(scenario())
    full = after.get("dir_full_sent", 0) - before.get("dir_full_sent", 0)
    deltas = after.get("dir_delta_sent", 0) - before.get("dir_delta_sent", 0)
    nbytes = after.get("dir_bytes_sent", 0) - before.get("dir_bytes_sent", 0)
    print(f"{n} subscriptions: dir_full_sent +{full}, dir_delta_sent +{deltas}, dir_bytes_sent "
          f"+{nbytes} for {topic_bytes} bytes of topics")
    assert payload == {"last": True}
    assert full == 0
    # At most one delta per change. The stats queries' own probe agents (registered on a and gone
    # again) are changes too: up to two each, for the query before and the one after.
    assert 0 < deltas <= n + 4
    assert nbytes < 5 * topic_bytes
    assert a.alive() and b.alive()


def test_a_lost_delta_is_repaired_by_the_version_gap_resync(meshd_factory: MeshdFactory) -> None:
    """b loses the first delta about agent "sub" (its registration; the test hook): that and the
    subscriptions after it come back with the full directory that the version gap (the next
    delta, or a's heartbeat) makes b ask for."""
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b", env={"MESHD_TEST_DROP_DIR_DELTA": "sub"})
    meshd_factory.wait_mesh([a, b])

    async def scenario() -> None:
        async with Agent("sub", socket=a.socket) as sub, Agent("pub", socket=b.socket) as pub:
            got: asyncio.Queue[Any] = asyncio.Queue()
            sub.on("after")(lambda m: got.put_nowait(m.payload))
            await async_wait_until(lambda: _dir_stats(b).get("dir_delta_dropped_by_test") == 1,
                                   what="b to drop the delta registering sub")
            await sub.subscribe("before")
            await sub.subscribe("after")
            await wait_listed(pub, "sub")
            await async_wait_until(lambda: _sees_topics(pub, "sub", {"before", "after"}),
                                   what="b's view of sub's topics")
            assert await pub.publish("after", "hi", reach=True) == 1
            assert await asyncio.wait_for(got.get(), 10) == "hi"

    full_before = _dir_stats(a).get("dir_full_sent", 0)
    asyncio.run(scenario())
    stats_b, stats_a = _dir_stats(b), _dir_stats(a)
    print(f"lost delta: b {stats_b}, a {stats_a}")
    assert stats_b.get("dir_delta_dropped_by_test") == 1
    assert stats_a.get("dir_full_sent", 0) > full_before  # the resync: a full directory again
    assert stats_a.get("dir_delta_sent", 0) >= 2
