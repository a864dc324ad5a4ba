"""A message's ``tasks`` array (coms-net style) reaches the receiving agent as ``msg.tasks`` and is
printed by ``meshctl tail``; ``meshctl top`` summarizes an agent's ``tasks_summary``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from meshd import Agent
from meshd.cli.format import task_summary_cell
from meshd.testing import MeshdFactory, wait_listed, wait_until

CTL = [sys.executable, "-c", "import sys; from meshd.cli import meshctl_main; sys.exit(meshctl_main())"]
TASKS = [{"title": "read the logs", "status": "done"}, {"title": "write the fix", "status": "in_progress"}]


def test_tasks_array_reaches_handler_and_tail(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    tail_out = tmp_path / "tail.jsonl"
    with open(tail_out, "w") as out:
        tail = subprocess.Popen([*CTL, "--socket", str(b.socket), "tail", "progress"], stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: any("progress" in (x.get("topics") or []) for x in a.query("agents")),
                   what="the tail subscribed")

        async def scenario() -> list[Any]:
            async with Agent("lead", socket=a.socket) as lead, Agent("dev", socket=b.socket) as dev:
                got: asyncio.Queue[Any] = asyncio.Queue()

                @dev.on("status")
                async def status(msg: Any) -> Any:
                    got.put_nowait(msg.tasks)
                    return len(msg.tasks)

                await wait_listed(lead, "dev")
                junk = [*TASKS, {"title": 3}, "nope"]  # malformed items are left out, not fatal
                assert await lead.request("dev", "status", {}, headers={"tasks": junk}, timeout=5) == 2
                await lead.send("dev", "status", {})
                seen = [await asyncio.wait_for(got.get(), 5), await asyncio.wait_for(got.get(), 5)]
                await lead.publish("progress", {"step": 2}, headers={"tasks": TASKS})
                return seen

        seen = asyncio.run(scenario())
        assert seen == [TASKS, []]
        wait_until(lambda: "write the fix" in tail_out.read_text(), what="the tail printed the tasks")
        line = json.loads(tail_out.read_text().splitlines()[0])
        assert line["tasks"] == TASKS and line["payload"] == {"step": 2}
    finally:
        tail.terminate()
        tail.wait(10)


def test_top_summarizes_tasks() -> None:
    assert task_summary_cell(TASKS) == "done=1 in_progress=1"
    assert task_summary_cell({"running": 2, "done": 7}) == "running=2 done=7"
    assert task_summary_cell(None) == ""
    assert len(task_summary_cell("x" * 100)) == 40
