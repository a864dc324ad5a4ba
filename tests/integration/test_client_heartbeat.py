"""``Agent(auto_heartbeat=False)`` and ``Agent.heartbeat()`` against a real daemon: an agent that
does not beat goes stale as any silent agent does, and one call to ``heartbeat()`` brings it back
online with its telemetry (what the HTTP gateway does for its clients' beats)."""

from __future__ import annotations

import asyncio

from meshd import Agent
from meshd.testing import MeshdFactory, async_wait_until, wait_listed


def test_agent_beats_only_when_told(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")  # fast liveness: stale after 1 s, offline after 2 s

    async def scenario() -> None:
        async with Agent("watcher", socket=a.socket) as watcher, \
                Agent("quiet", socket=a.socket, auto_heartbeat=False, heartbeat_interval=0.1) as quiet:
            await wait_listed(watcher, "quiet")

            async def state() -> object:
                rows = [r for r in await watcher.agents() if r["name"] == "quiet"]
                return rows[0].get("state") if rows else "absent"

            async def is_(want: str) -> bool:
                return await state() == want

            await async_wait_until(lambda: is_("stale"), 15, what="the silent agent to go stale")
            quiet.set_telemetry(context_used_pct=17)
            quiet.heartbeat()
            await async_wait_until(lambda: is_("online"), 15, what="one heartbeat to bring it back")
            rows = [r for r in await watcher.agents() if r["name"] == "quiet"]
            assert rows[0]["telemetry"]["context_used_pct"] == 17

    asyncio.run(scenario())
