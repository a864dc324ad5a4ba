"""``meshctl tasks list|show|cancel`` against a daemon that hosts the task service (the system
agent of the tools). Skipped, with the reason, only while this build has no ``Agent.call_tool``
(the tools land in a parallel branch; the coordinator removes the skip at the merge)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest

from meshd import Agent
from meshd.tasks import TaskWorker
from meshd.testing import MeshdFactory, async_wait_until, wait_listed

CTL = [sys.executable, "-c", "import sys; from meshd.cli import meshctl_main; sys.exit(meshctl_main())"]

pytestmark = pytest.mark.skipif(not hasattr(Agent, "call_tool"),
                                reason="needs the tools' Agent.call_tool and system agent (parallel branch)")


def ctl(socket: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CTL, "--socket", str(socket), *args], capture_output=True, text=True, timeout=60)


def test_meshctl_tasks_list_show_cancel(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")

    async def scenario() -> None:
        async with Agent("worker", socket=a.socket, capabilities=["sum"]) as worker, \
                Agent("boss", socket=a.socket) as boss:
            TaskWorker(worker, lambda t: sum(t.input))
            await wait_listed(boss, "worker")
            done = await boss.call_tool("create_task", {"title": "add", "capability": "sum", "input": [1, 2]})
            waiting = await boss.call_tool("create_task", {"title": "never", "capability": "nobody"})

            async def finished() -> bool:
                status = await boss.call_tool("task_status", {"task_id": done["id"]})
                return bool(status["state"] == "done")
            await async_wait_until(finished, what="the task to be done")

            listed = ctl(a.socket, "tasks", "list", "--json")
            assert listed.returncode == 0, listed.stderr
            rows = {r["id"]: r for r in json.loads(listed.stdout)}
            assert rows[done["id"]]["state"] == "done" and rows[done["id"]]["assignee"] == "worker"
            assert rows[waiting["id"]]["state"] == "ready"
            table = ctl(a.socket, "tasks", "list")
            assert "no online agent with capability 'nobody'" in table.stdout
            shown = ctl(a.socket, "tasks", "show", done["id"])
            assert json.loads(shown.stdout)["result"] == 3
            cancelled = ctl(a.socket, "tasks", "cancel", waiting["id"])
            assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
            missing = ctl(a.socket, "tasks", "show", "t-nope")
            assert missing.returncode == 1 and "NO_SUCH_TASK" in missing.stderr

    asyncio.run(scenario())

