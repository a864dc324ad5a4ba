"""``meshctl tasks list|show|cancel`` and ``meshctl deadletters`` against a daemon that hosts the
task service (the system agent of the tools)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

from meshd import Agent
from meshd.tasks import TaskWorker
from meshd.testing import MeshdFactory, async_wait_until, wait_listed, wait_until

CTL = [sys.executable, "-c", "import sys; from meshd.cli import meshctl_main; sys.exit(meshctl_main())"]

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



def test_failed_task_leaves_a_dead_letter(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a", env={"MESHD_DEAD_LETTER_JSONL": "1"})

    async def scenario() -> str:
        async with Agent("boss", socket=a.socket) as boss:
            task = await boss.call_tool("create_task", {"title": "impossible", "capability": "nobody",
                                                        "deadline_s": 0.5})
            done = await boss.call_tool("wait_task", {"task_id": task["id"], "timeout_s": 30})
            assert done["state"] == "failed"
            return str(task["id"])

    task_id = asyncio.run(scenario())
    listed = ctl(a.socket, "deadletters", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    letters = [d for d in json.loads(listed.stdout) if d["reason"] == "TASK_FAILED"]
    assert len(letters) == 1, listed.stdout
    header = letters[0]["header"]
    assert header["task_id"] == task_id and header["title"] == "impossible"
    assert header["capability"] == "nobody" and "deadline passed" in header["error"]
    assert letters[0]["kind"] == "task" and letters[0]["from"] == "boss"
    table = ctl(a.socket, "deadletters", "list")
    assert "TASK_FAILED" in table.stdout and task_id in table.stdout
    # the dead-letter hook got it too (the built-in JSONL sink)
    sink = a.state_dir / "deadletters.jsonl"

    def sunk() -> list[dict[str, Any]]:
        lines = sink.read_text().splitlines() if sink.exists() else []
        return [d for d in map(json.loads, lines) if d.get("reason") == "TASK_FAILED"]
    wait_until(lambda: sunk(), 10, what="the TASK_FAILED letter in deadletters.jsonl")
    assert sunk()[0]["header"]["task_id"] == task_id
    # a task letter is not a message: replaying it sends nothing
    replay = ctl(a.socket, "deadletters", "replay", "--reason", "TASK_FAILED")
    assert replay.returncode == 0 and "replayed 0" in replay.stdout
