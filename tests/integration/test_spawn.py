"""The Spawner with a real daemon: children from config templates register as agents, their output
reaches the log, quotas and unknown templates are typed errors, a crashing child is restarted
within its bound, and no child outlives stop_all or the (kill -9'd) process that spawned it.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from meshd import Agent
from meshd.config.settings import Settings
from meshd.errors import NoSuchTemplate, SpawnFailed, SpawnQuota
from meshd.testing import MeshdFactory, async_wait_until, pid_alive, wait_listed, wait_until
from meshd.tools.spawn import Spawner

CHILD = str(Path(__file__).with_name("spawn_child.py"))


def spawn_settings(tmp_path: Path, **spawn: Any) -> Settings:
    templates = [
        {"name": "helper", "command": [sys.executable, CHILD], "capabilities": ["help", "sum"],
         "max_instances": 2},
        {"name": "crasher", "command": [sys.executable, CHILD, "crash"], "restart": "on-failure"},
        {"name": "missing", "command": ["/nonexistent/agent-binary"]},
    ]
    return Settings(state_dir=tmp_path, spawn={"templates": templates, "stop_timeout": 3.0, **spawn})


def test_spawn_templates_quota_log_and_stop(meshd_factory: MeshdFactory, tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    a = meshd_factory.spawn("a")
    caplog.set_level(logging.INFO, logger="meshd.spawn")

    async def scenario() -> None:
        events: list[tuple[str, dict[str, Any]]] = []
        spawner = Spawner(spawn_settings(tmp_path, log_line_bytes=100), a.socket,
                          emit=lambda e, d: events.append((e, d)))
        async with Agent("watcher", socket=a.socket) as watcher:
            try:
                with pytest.raises(NoSuchTemplate, match=r"'rm-rf'.*helper"):
                    await spawner.spawn("rm-rf", requester="llm")
                first = await spawner.spawn("helper", requester="llm")
                second = await spawner.spawn("helper", requester="llm", name="helper-b")
                with pytest.raises(SpawnQuota, match="max_instances = 2"):
                    await spawner.spawn("helper", requester="llm")
                with pytest.raises(SpawnFailed, match="nonexistent"):
                    await spawner.spawn("missing", requester="llm")
                await wait_listed(watcher, first["name"], "helper-b")
                listed = {x["name"]: x for x in await watcher.agents()}
                assert listed["helper-b"]["capabilities"] == ["help", "sum"]
                await async_wait_until(
                    lambda: any("ready (spawned by llm)" in r.getMessage() for r in caplog.records),
                    what="the child's output in the log")
                await async_wait_until(lambda: any("[cut]" in r.getMessage() for r in caplog.records),
                                       what="the over-long line, cut")
                cut = next(r.getMessage() for r in caplog.records if "[cut]" in r.getMessage())
                assert len(cut) < 200
                running = {c["name"] for c in spawner.list() if c["state"] == "running"}
                assert running == {first["name"], "helper-b"}
                pids = [first["pid"], second["pid"]]
            finally:
                await spawner.stop_all()
            assert not any(pid_alive(pid) for pid in pids)
            await wait_listed(watcher, first["name"], "helper-b", present=False)
            assert {c["state"] for c in spawner.list() if c["template"] == "helper"} == {"stopped"}
            assert [e for e, _ in events].count("spawn.started") == 2
            assert [e for e, _ in events].count("spawn.stopped") == 2

    asyncio.run(scenario())


def test_crashing_child_restarted_within_bound(tmp_path: Path) -> None:
    async def scenario() -> None:
        events: list[tuple[str, dict[str, Any]]] = []
        spawner = Spawner(spawn_settings(tmp_path, max_restarts=2), tmp_path / "none.sock",
                          emit=lambda e, d: events.append((e, d)))
        try:
            await spawner.spawn("crasher", requester="llm")
            await async_wait_until(lambda: any(c["state"] == "crashed" for c in spawner.list()), 20,
                                   what="the crasher to be given up on")
        finally:
            await spawner.stop_all()
        names = [e for e, _ in events]
        assert names == ["spawn.started", "spawn.crashed", "spawn.restarted", "spawn.crashed",
                         "spawn.restarted", "spawn.crashed"]
        assert [d["will_restart"] for e, d in events if e == "spawn.crashed"] == [True, True, False]
        final = spawner.list()[0]
        assert final["returncode"] == 3 and final["restarts"] == 2

    asyncio.run(scenario())


OWNER = """
import asyncio, sys
from pathlib import Path
from meshd.config import Settings
from meshd.tools.spawn import Spawner

async def main():
    settings = Settings(state_dir=Path(sys.argv[1]), spawn={"templates": [
        {"name": "helper", "command": [sys.executable, sys.argv[2]], "capabilities": ["help"]}]})
    spawner = Spawner(settings, Path(sys.argv[3]))
    child = await spawner.spawn("helper", requester="test")
    print(child["pid"], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_children_die_with_a_killed_owner(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    a = meshd_factory.spawn("a")
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path), CHILD, str(a.socket)],
                             stdout=subprocess.PIPE)
    try:
        assert owner.stdout is not None
        pid = int(owner.stdout.readline())
        wait_until(lambda: "helper-1" in {x["name"] for x in a.query("agents")}, what="the child to register")
        owner.kill()  # SIGKILL: no stop_all runs; the kernel's parent-death signal must end the child
        owner.wait(10)
        wait_until(lambda: not pid_alive(pid), 10, what=f"child {pid} to die with its owner")
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(10)
