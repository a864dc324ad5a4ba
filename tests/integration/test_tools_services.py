"""The task and spawn tools over the daemon's own services, with real daemons: the per-agent
max_concurrent_tasks quota; spawn_agent with an unknown template (typed error), the max_spawned
quota, and children gone once the daemon stops."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import pytest

from meshd import Agent
from meshd.errors import MeshError, QuotaExceeded
from meshd.testing import MeshdFactory, pid_alive, wait_listed, wait_until

CHILD = Path(__file__).with_name("spawn_child.py")


def test_concurrent_tasks_quota(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    conf = tmp_path / "meshd.toml"
    conf.write_text("[tools]\nmax_concurrent_tasks = 2\n")
    a = meshd_factory.spawn("a", "--config", str(conf))

    async def scenario() -> None:
        async with Agent("boss", socket=a.socket) as boss, Agent("other", socket=a.socket) as other:
            first = await boss.call_tool("create_task", {"title": "t1", "capability": "nobody"})
            with pytest.raises(QuotaExceeded, match="max_concurrent_tasks"):
                await boss.call_tool("create_plan", {"tasks": [
                    {"id": "a", "title": "a", "capability": "nobody"},
                    {"id": "b", "title": "b", "capability": "nobody", "deps": ["a"]}]})
            await boss.call_tool("create_task", {"title": "t2", "capability": "nobody"})
            with pytest.raises(QuotaExceeded):
                await boss.call_tool("create_task", {"title": "t3", "capability": "nobody"})
            assert (await other.call_tool("create_task", {"title": "o1", "capability": "nobody"}))["id"]
            cancelled = await boss.call_tool("cancel_task", {"task_id": first["id"]})
            assert cancelled["state"] == "cancelled"
            assert (await boss.call_tool("create_task", {"title": "t3", "capability": "nobody"}))["id"]

    asyncio.run(scenario())


def test_spawn_agent_tool(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    conf = tmp_path / "meshd.toml"
    conf.write_text(textwrap.dedent(f"""
        [tools]
        max_spawned = 1

        [[spawn.templates]]
        name = "helper"
        command = [{sys.executable!r}, {str(CHILD)!r}]
        capabilities = ["help"]
        max_instances = 3
    """))
    a = meshd_factory.spawn("a", "--config", str(conf))
    pids: list[int] = []

    async def scenario() -> None:
        async with Agent("boss", socket=a.socket) as boss:
            with pytest.raises(MeshError, match="no spawn template 'nope'") as info:
                await boss.call_tool("spawn_agent", {"template": "nope"})
            assert info.value.code == "NO_SUCH_TEMPLATE"
            child = await boss.call_tool("spawn_agent", {"template": "helper", "name": "helper-1"})
            assert child["name"] == "helper-1" and child["requester"] == "boss"
            pids.append(int(child["pid"]))
            await wait_listed(boss, "helper-1", timeout=20)
            with pytest.raises(QuotaExceeded, match="max_spawned"):
                await boss.call_tool("spawn_agent", {"template": "helper"})

    asyncio.run(scenario())
    assert pids and pid_alive(pids[0])
    assert a.stop() == 0
    wait_until(lambda: not pid_alive(pids[0]), 10, what="the spawned child to be gone")
