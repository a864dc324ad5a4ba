"""Tasks across three netlab hosts: a plan runs on agents of other hosts picked by capability and
load, and a task whose host is cut off mid-task is retried on another host.

The task service runs in this process on an agent attached to host 1's daemon (as host 1's system
agent will); workers are agents of hosts 2 and 3 (their ipc sockets are files, reachable from the
root namespace). Needs root, iproute2 and netlab; skipped with a reason otherwise. netlab prefix
``tk`` (this helper's own); the lab is removed at teardown whatever happens.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshd import Agent
from meshd.config.settings import Settings, TaskSettings
from meshd.tasks import TaskCall, TaskService, TaskWorker
from meshd.testing import async_wait_until, short_tempdir, wait_listed
from meshd.testing.netlab import random_prefix

from .conftest import MultiHost, Netlab, running, skip_reason

pytestmark = pytest.mark.multihost


@pytest.fixture(scope="module")
def hosts(request: pytest.FixtureRequest) -> Iterator[MultiHost]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    mh = MultiHost(Netlab(random_prefix("tk")), short_tempdir("mshtk-"), mesh=f"tk{uuid.uuid4().hex[:12]}")
    with running(request, mh):
        mh.wait_full_mesh()
        yield mh


def test_plan_across_hosts_and_retry_after_a_cut(hosts: MultiHost, tmp_path: Path) -> None:
    d1 = hosts.daemons[1]

    async def scenario() -> None:
        gate = asyncio.Event()
        ran: list[tuple[str, str]] = []

        def worker(name: str, host: int) -> Agent:
            return Agent(name, socket=hosts.daemons[host].socket, capabilities=["research", "write"],
                         heartbeat_interval=0.25)

        r2, r3 = worker("r2", 2), worker("r3", 3)
        async with Agent("owner", socket=d1.socket) as owner:
            for agent, load in ((r2, 0), (r3, 5)):
                await agent.connect()
                agent.set_telemetry(queue_depth=load)

                async def handle(task: TaskCall, who: str = agent.name) -> Any:
                    ran.append((task.key or task.task_id, who))
                    if task.input == "hang-on-r2" and who == "r2":
                        await gate.wait()  # never released: r2's host is cut off meanwhile
                    return {"by": who, "deps": sorted(task.deps)}

                TaskWorker(agent, handle)
            await wait_listed(owner, "r2", "r3", timeout=20)

            async def loads_seen() -> bool:
                listed = await owner.agents()
                tele = {a["name"]: (a.get("telemetry") or {}).get("queue_depth") for a in listed}
                return tele.get("r2") == 0 and tele.get("r3") == 5
            await async_wait_until(loads_seen, 20, what="the workers' telemetry on host 1")

            settings = Settings(state_dir=tmp_path, tasks=TaskSettings(directory_refresh=0.1, max_attempts=3))
            service = TaskService(owner, tmp_path / "tasks.db", settings)
            await service.start()
            try:
                plan = await service.create_plan(creator="owner", tasks=[
                    {"id": "a", "title": "a", "capability": "research", "input": 1},
                    {"id": "b", "title": "b", "capability": "write", "input": 2, "deps": ["a"]}])
                await async_wait_until(lambda: service.plan_status(plan["id"])["state"] != "running", 30,
                                       what="the plan across hosts")
                status = service.plan_status(plan["id"])
                assert status["state"] == "done"
                assert [(t["key"], t["assignee"]) for t in status["tasks"]] == [("a", "r2"), ("b", "r2")]
                assert status["tasks"][1]["result"] == {"by": "r2", "deps": ["a"]}

                # r2 (least loaded) takes a task and hangs; its host is cut off; r3 gets it
                rec = await service.create_task(creator="owner", title="cut", input="hang-on-r2",
                                                capability="research")
                await async_wait_until(lambda: (rec["id"], "r2") in ran, 10, what="r2 to start the task")
                hosts.lab.cut(2)
                try:
                    done = await service.wait_task(rec["id"], 30)
                finally:
                    hosts.lab.plug(2)
                assert done["state"] == "done", done
                assert done["assignee"] == "r3" and done["attempts"] == 2 and done["tried"] == ["r2"]
            finally:
                await service.stop()
                gate.set()
                for agent in (r2, r3):
                    await agent.close()

    asyncio.run(scenario())
    hosts.wait_full_mesh()  # the lab is whole again for whatever runs next
