"""Publish the README's way (a plain ``await me.publish(...)`` loop) through real daemons: it
returns at once and nothing is lost; ``reach=True`` still returns the reach count; a publish the
daemon refuses is reported through ``on_error``, never silently."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from meshd import Agent, BlockingAgent, MeshError
from meshd.testing import MeshdFactory, async_wait_until, wait_listed


def test_a_plain_publish_loop_reaches_every_subscriber_without_waiting_for_the_daemon(
        meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    n = 3000

    async def scenario() -> None:
        async with Agent("pub", socket=a.socket) as pub, Agent("s1", socket=b.socket) as s1, \
                Agent("s2", socket=b.socket) as s2:
            got: dict[str, list[int]] = {"s1": [], "s2": []}
            # Warm-up publications (i = -1, several until both are counted) apart: one can still
            # arrive after the loop below has begun.
            warm: dict[str, list[int]] = {"s1": [], "s2": []}
            for me in (s1, s2):
                @me.on("ticks")
                async def tick(msg: Any, name: str = me.name) -> None:
                    i = msg.payload["i"]
                    (warm if i < 0 else got)[name].append(i)
                await me.subscribe("ticks")

            async def both_seen() -> bool:
                return await pub.publish("ticks", {"i": -1}, reach=True) == 2
            await wait_listed(pub, "s1", "s2")
            await async_wait_until(both_seen, 15, interval=0.05, what="both subscribers counted")
            await async_wait_until(lambda: all(warm.values()), what="the warm-up publication")
            results = [await pub.publish("ticks", {"i": i}) for i in range(n)]
            assert results == [None] * n, "without reach=True, publish returns once queued"
            await async_wait_until(lambda: all(len(v) >= n for v in got.values()), 30,
                                   what=f"{n} publications at both subscribers")
            assert got["s1"] == list(range(n)) and got["s2"] == list(range(n)), "in order, none lost"
            await async_wait_until(lambda: not pub._unconfirmed, what="the daemon to confirm them")
            assert pub.errors_received == 0
            assert await pub.publish("ticks", {"i": n}, reach=True) == 2

    asyncio.run(scenario())


def test_a_publish_the_daemon_refuses_reaches_on_error(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a", env={**os.environ, "MESHD_MAX_PAYLOAD_BYTES": "2048"})

    async def scenario() -> None:
        # The client allows more than the daemon does, so the daemon is the one to refuse.
        async with Agent("pub", socket=a.socket, max_payload_bytes=65536) as pub:
            errors: list[tuple[MeshError, str | None]] = []
            pub.on_error = lambda err, msg_id: errors.append((err, msg_id))
            assert await pub.publish("big", "x" * 8000) is None
            await async_wait_until(lambda: errors, what="the refusal")
            [(err, _)] = errors
            assert err.code == "TOO_LARGE"
            assert not pub._unconfirmed, "a refused publish is not waited for"

    asyncio.run(scenario())


def test_a_full_subscriber_inbox_tells_the_publisher_inbox_full(meshd_factory: MeshdFactory) -> None:
    """qos-0 publications a full inbox refuses are lost for that subscriber, but not in silence:
    the publisher hears INBOX_FULL (with the topic) through on_error, and its publish loop pauses."""
    # The stuck handler blocks the subscriber's loop, so it stops heartbeating too: at the suite's
    # 2 s offline limit a loaded machine removed it before its inbox filled (and then nothing is
    # refused). Agent liveness here is slow enough to outlast the whole scenario.
    slow = ("--heartbeat-interval", "0.5", "--stale-after", "45", "--offline-after", "60")
    a = meshd_factory.spawn("a", *slow)
    b = meshd_factory.spawn("b", *slow)
    meshd_factory.wait_mesh([a, b])
    release = threading.Event()
    got: list[int] = []

    def stuck(msg: Any) -> None:  # blocks the subscriber's loop: its socket is not read
        release.wait(30)
        got.append(msg.payload)

    sub = BlockingAgent("stuck", socket=b.socket)
    try:
        sub.on("feed")(stuck)
        sub.subscribe("feed")

        async def scenario() -> list[MeshError]:
            # batch_max=1: every publication is one ZeroMQ message, so the inbox fills quickly.
            async with Agent("pub", socket=a.socket, batch_max=1) as pub:
                errors: list[MeshError] = []
                pub.on_error = lambda err, _id: errors.append(err)

                async def counted() -> bool:
                    return await pub.publish("feed", 0, reach=True) == 1
                await async_wait_until(counted, 15, interval=0.05, what="the subscriber counted")
                for i in range(40_000):
                    await pub.publish("feed", i)
                    if errors:
                        break
                await async_wait_until(lambda: errors, 20, what="INBOX_FULL from the subscriber's daemon")
                return errors

        errors = asyncio.run(scenario())
    finally:
        release.set()
        sub.close()
    err = errors[0]
    assert err.code == "INBOX_FULL" and "stuck" in err.message and err.retry_after
