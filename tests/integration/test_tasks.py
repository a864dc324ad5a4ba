"""Tasks and plans with real daemons on 127.0.0.1: scheduling by capability and load, retries,
plans across daemons, validation, and kill -9 of the owning side in the middle of a 200-task plan.

The TaskService runs in the test process (or in a subprocess, to kill it) with an Agent attached
to a real daemon, as the daemon's system agent will host it. Workers are real agents with a
TaskWorker; handler runs are counted, never assumed.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from meshd import Agent
from meshd.config.settings import Settings
from meshd.errors import NoSuchTask, ValidationFailed
from meshd.tasks import REPLAN_TOPIC, TaskCall, TaskService, TaskWorker
from meshd.testing import MeshdFactory, async_wait_until, wait_listed, wait_until

AGENTS = Path(__file__).with_name("task_agents.py")


def settings(**tasks: Any) -> Settings:
    return Settings(tasks={"directory_refresh": 0.1, **tasks})


class Events:
    """Collects what the service emits."""

    def __init__(self) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, name: str, data: dict[str, Any]) -> None:
        self.items.append((name, data))

    def names(self, task_id: str) -> list[str]:
        return [n for n, d in self.items if d.get("id") == task_id]


def test_least_loaded_capable_agent_gets_the_task(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])

    async def scenario() -> None:
        runs: Counter[str] = Counter()
        loads = {"busy": 8, "idle": 0, "mid": 3}
        agents = [Agent(name, socket=b.socket if name != "mid" else a.socket, capabilities=["sum"],
                        heartbeat_interval=0.1) for name in loads]
        # a capable-looking agent of another capability must never be picked
        other = Agent("other", socket=b.socket, capabilities=["draw"], heartbeat_interval=0.1)
        async with Agent("owner", socket=a.socket) as owner:
            for agent in [*agents, other]:
                await agent.connect()
                agent.set_telemetry(queue_depth=loads.get(agent.name, 0), context_used_pct=10)

                async def handle(task: TaskCall, name: str = agent.name) -> Any:
                    runs[name] += 1
                    return sum(task.input)

                TaskWorker(agent, handle)
            await wait_listed(owner, *loads, "other")

            async def reported() -> bool:
                listed = await owner.agents()
                tele = {x["name"]: (x.get("telemetry") or {}).get("queue_depth") for x in listed}
                return all(tele.get(n) == v for n, v in loads.items())
            await async_wait_until(reported, what="telemetry of the three agents")

            events = Events()
            service = TaskService(owner, tmp_path / "tasks.db", settings(), emit=events)
            await service.start()
            try:
                for _ in range(3):
                    rec = await service.create_task(creator="owner", title="add", input=[1, 2],
                                                    capability="sum")
                    done = await service.wait_task(rec["id"], 10)
                    assert done["state"] == "done" and done["result"] == 3
                    assert done["assignee"] == "idle" and done["attempts"] == 1
                    assert events.names(rec["id"]) == ["task.created", "task.assigned", "task.done"]
                # the idle one now reports the most load: the next task goes to the middle one
                agents[1].set_telemetry(queue_depth=20)

                async def idle_busy() -> bool:
                    return any(x["name"] == "idle" and (x.get("telemetry") or {}).get("queue_depth") == 20
                               for x in await owner.agents())
                await async_wait_until(idle_busy, what="new telemetry of 'idle'")
                rec = await service.create_task(creator="owner", title="add", input=[2, 2], capability="sum")
                done = await service.wait_task(rec["id"], 10)
                assert done["assignee"] == "mid" and done["result"] == 4
                assert runs == {"idle": 3, "mid": 1}
            finally:
                await service.stop()
                for agent in [*agents, other]:
                    await agent.close()

    asyncio.run(scenario())


def test_no_capable_agent_waits_with_why_then_fails_at_deadline(meshd_factory: MeshdFactory,
                                                                tmp_path: Path) -> None:
    a = meshd_factory.spawn("a")

    async def scenario() -> None:
        async with Agent("owner", socket=a.socket) as owner:
            events = Events()
            service = TaskService(owner, tmp_path / "tasks.db", settings(), emit=events)
            await service.start()
            try:
                rec = await service.create_task(creator="me", title="t", input=None, capability="nobody",
                                                deadline_s=1.5)
                waiting = await async_wait_until(
                    lambda: service.task_status(rec["id"]).get("why"), what="the why of a waiting task")
                assert waiting == "no online agent with capability 'nobody'"
                assert service.task_status(rec["id"])["state"] == "ready"
                done = await service.wait_task(rec["id"], 10)
                assert done["state"] == "failed"
                assert "deadline passed" in done["error"] and "nobody" in done["error"]
                failed = [d for n, d in events.items if n == "task.failed"]
                assert failed and failed[0]["dead_letter"] is True
                with pytest.raises(NoSuchTask):
                    service.task_status("t-nope")
            finally:
                await service.stop()

    asyncio.run(scenario())


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def start_workers(procs: list[subprocess.Popen[bytes]], socket: Path, prefix: str, count: int,
                  capability: str, runs: Path, *extra: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, str(AGENTS), "workers", "--socket", str(socket),
                             "--prefix", prefix, "--count", str(count), "--capability", capability,
                             "--runs", str(runs), *extra])
    procs.append(proc)
    wait_until(lambda: Path(str(runs) + ".ready").exists() or proc.poll() is not None, 30,
               what=f"workers {prefix} to register")
    assert proc.poll() is None, f"workers {prefix} exited with {proc.returncode}"
    return proc


def run_lines(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines() if line.strip()]


def test_agent_dying_mid_task_is_retried_elsewhere(meshd_factory: MeshdFactory, tmp_path: Path,
                                                   processes: list[subprocess.Popen[bytes]]) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    runs = tmp_path / "runs"
    doomed = start_workers(processes, b.socket, "doomed", 1, "fix", runs, "--block")

    async def scenario() -> None:
        async with Agent("owner", socket=a.socket) as owner:
            events = Events()
            service = TaskService(owner, tmp_path / "tasks.db", settings(max_attempts=3), emit=events)
            await service.start()
            try:
                await wait_listed(owner, "doomed-0")
                rec = await service.create_task(creator="owner", title="fix it", input={"n": 1},
                                                capability="fix")
                await async_wait_until(lambda: len(run_lines(runs)) == 1, what="the doomed worker to start")
                assert service.task_status(rec["id"])["assignee"] == "doomed-0"
                # a healthy worker appears; the doomed one dies with the task in its hands
                start_workers(processes, a.socket, "healthy", 1, "fix", tmp_path / "runs2")
                await wait_listed(owner, "healthy-0")
                os.kill(doomed.pid, signal.SIGKILL)
                done = await service.wait_task(rec["id"], 30)
                assert done["state"] == "done", done
                assert done["assignee"] == "healthy-0" and done["attempts"] == 2
                assert done["result"]["by"] == "healthy-0"
                assert done["tried"] == ["doomed-0"]
                assert events.names(rec["id"]) == ["task.created", "task.assigned", "task.retry",
                                                   "task.assigned", "task.done"]
                assert [r[0] for r in run_lines(tmp_path / "runs2")] == [rec["id"]]
            finally:
                await service.stop()

    asyncio.run(scenario())


def test_plan_across_daemons_deps_results_and_failure(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])

    async def scenario() -> None:
        async with Agent("planner", socket=a.socket) as planner, \
                Agent("searcher", socket=b.socket, capabilities=["search"]) as searcher, \
                Agent("writer", socket=a.socket, capabilities=["write"]) as writer, \
                Agent("breaker", socket=b.socket, capabilities=["break"]) as breaker:
            TaskWorker(searcher, lambda t: f"found {t.input}")
            TaskWorker(writer, lambda t: {"report": sorted(t.deps.items())})

            def broken(task: TaskCall) -> Any:
                raise RuntimeError("always fails")

            TaskWorker(breaker, broken)
            await wait_listed(planner, "searcher", "writer", "breaker")
            service = TaskService(planner, tmp_path / "tasks.db", settings(max_attempts=2))
            await service.start()
            try:
                plan = await service.create_plan(creator="planner", tasks=[
                    {"id": "s1", "title": "search 1", "capability": "search", "input": "x"},
                    {"id": "s2", "title": "search 2", "capability": "search", "input": "y"},
                    {"id": "w", "title": "write", "capability": "write", "deps": ["s1", "s2"]},
                ])
                assert plan["state"] == "running" and plan["counts"] == {"ready": 2, "pending": 1}
                await async_wait_until(lambda: service.plan_status(plan["id"])["state"] != "running",
                                       what="the plan to finish")
                status = service.plan_status(plan["id"])
                assert status["state"] == "done" and status["counts"] == {"done": 3}
                write = next(t for t in status["tasks"] if t["key"] == "w")
                assert write["result"] == {"report": [["s1", "found x"], ["s2", "found y"]]}
                assert write["assignee"] == "writer"

                bad = await service.create_plan(creator="planner", tasks=[
                    {"id": "b", "title": "break", "capability": "break"},
                    {"id": "after", "title": "after", "capability": "write", "deps": ["b"]},
                    {"id": "later", "title": "later", "capability": "write", "deps": ["after"]},
                ])
                await async_wait_until(lambda: service.plan_status(bad["id"])["state"] != "running",
                                       what="the failing plan to finish")
                status = service.plan_status(bad["id"])
                assert status["state"] == "failed"
                by_key = {t["key"]: t for t in status["tasks"]}
                assert by_key["b"]["state"] == "failed" and by_key["b"]["attempts"] == 2
                assert "always fails" in by_key["b"]["error"]
                assert by_key["after"]["state"] == "failed"
                assert by_key["after"]["error"] == "dependency 'b' failed"
                assert by_key["later"]["state"] == "failed" and by_key["later"]["attempts"] == 0
            finally:
                await service.stop()

    asyncio.run(scenario())


def test_plan_validation_creates_nothing(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    a = meshd_factory.spawn("a")

    async def scenario() -> None:
        async with Agent("owner", socket=a.socket) as owner:
            service = TaskService(owner, tmp_path / "tasks.db", settings(max_plan_tasks=3))
            await service.start()
            try:
                one = {"id": "a", "title": "a", "capability": "c"}
                cases = [
                    ([{**one, "deps": ["b"]}, {"id": "b", "title": "b", "capability": "c", "deps": ["a"]}],
                     "dependency cycle a -> b -> a"),
                    ([{**one, "deps": ["zz"]}], "unknown dependency 'zz'"),
                    ([{"id": str(i), "title": "t", "capability": "c"} for i in range(4)],
                     "4 tasks exceed tasks.max_plan_tasks = 3"),
                    ([{"id": "a", "title": "a"}], "tasks[0].capability"),
                    ([one, one], "used twice"),
                ]
                for tasks, expected in cases:
                    with pytest.raises(ValidationFailed, match=re.escape(expected)):
                        await service.create_plan(creator="owner", tasks=tasks)
                with pytest.raises(ValidationFailed, match="rounds"):
                    await service.create_plan(creator="owner", tasks=[one], rounds=99)
                with pytest.raises(ValidationFailed, match=r"tasks\[a\]\.input: \d+ bytes encoded"):
                    await service.create_plan(creator="owner", tasks=[{**one, "input": "x" * 2_000_000}])
                with pytest.raises(ValidationFailed, match="input: payload is not msgpack-encodable"):
                    await service.create_task(creator="owner", title="t", input=object(), capability="c")
                with pytest.raises(ValidationFailed, match="deadline_s"):
                    await service.create_task(creator="owner", title="t", input=1, capability="c",
                                              deadline_s=0)
                assert service.list_tasks() == []
                assert service.store is not None and service.store.plans == {}
            finally:
                await service.stop()
        db = sqlite3.connect(tmp_path / "tasks.db")
        assert db.execute("SELECT count(*) FROM tasks").fetchone() == (0,)

    asyncio.run(scenario())


def stored_states(db_path: Path) -> dict[str, str]:
    try:
        db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    except sqlite3.OperationalError:  # not created yet
        return {}
    try:
        return {row[0]: row[1] for row in db.execute("SELECT id, state FROM tasks")}
    except sqlite3.OperationalError:
        return {}
    finally:
        db.close()


def test_kill9_of_owner_mid_plan_every_task_done_exactly_once(
        meshd_factory: MeshdFactory, tmp_path: Path, processes: list[subprocess.Popen[bytes]]) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    runs = tmp_path / "runs"
    start_workers(processes, b.socket, "w", 4, "work", runs, "--delay", "0.05")
    store = tmp_path / "tasks.db"
    owner_cmd = [sys.executable, str(AGENTS), "owner", "--socket", str(a.socket), "--store", str(store),
                 "--tasks", "200", "--capability", "work"]
    owner = subprocess.Popen(owner_cmd, stdout=subprocess.PIPE)
    processes.append(owner)
    # kill -9 the owning side (its daemon and the process holding the TaskService) mid-plan
    wait_until(lambda: Counter(stored_states(store).values())["done"] >= 40, 60, 0.05, what="40 tasks done")
    os.kill(owner.pid, signal.SIGKILL)
    a.kill()
    owner.wait(10)
    states = Counter(stored_states(store).values())
    print(f"at the kill: {dict(states)}; handler runs so far {len(run_lines(runs))}")
    assert states["done"] < 200
    a.start()
    owner2 = subprocess.Popen(owner_cmd, stdout=subprocess.PIPE)
    processes.append(owner2)
    assert owner2.stdout is not None
    line = owner2.stdout.readline().decode().strip()  # bounded by the test timeout
    assert line == "finished done", line
    final = stored_states(store)
    assert len(final) == 200 and set(final.values()) == {"done"}
    runs_per_task = Counter(r[0] for r in run_lines(runs))
    assert set(runs_per_task) == set(final)
    twice = {t: n for t, n in runs_per_task.items() if n > 1}
    print(f"tasks=200 done={len(final)} handler_runs={sum(runs_per_task.values())} ran_twice={len(twice)}")
    assert not twice, f"tasks whose handler ran more than once: {twice}"
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    records = [msgpack.unpackb(row[0], raw=False) for row in db.execute("SELECT record FROM tasks")]
    db.close()
    # every task of a later layer got the result of its dependency
    for rec in records:
        if rec["deps"]:
            deps = rec["result"]["deps"]
            assert deps and all(v["by"].startswith("w-") for v in deps.values())


def test_plan_rounds_ask_the_creator_and_stop_when_it_says_so(meshd_factory: MeshdFactory,
                                                              tmp_path: Path) -> None:
    a = meshd_factory.spawn("a")

    async def scenario() -> None:
        async with Agent("planner", socket=a.socket) as planner, \
                Agent("doubler", socket=a.socket, capabilities=["double"]) as doubler:
            TaskWorker(doubler, lambda t: t.input * 2)
            asked: list[dict[str, Any]] = []

            @planner.on(REPLAN_TOPIC)
            def replan(msg: Any) -> Any:
                asked.append(msg.payload)
                if msg.payload["round"] == 1:  # one more round, fed with this round's result
                    return {"tasks": [{"id": "again", "title": "double again", "capability": "double",
                                       "input": msg.payload["results"]["d"]}]}
                return None  # enough

            await wait_listed(planner, "doubler")
            service = TaskService(planner, tmp_path / "tasks.db", settings())
            await service.start()
            try:
                plan = await service.create_plan(creator="planner", rounds=3, tasks=[
                    {"id": "d", "title": "double", "capability": "double", "input": 5}])
                await async_wait_until(lambda: service.plan_status(plan["id"])["state"] != "running",
                                       what="the plan to finish")
                status = service.plan_status(plan["id"])
                assert status["state"] == "done" and status["round"] == 2 and status["rounds"] == 2
                assert [(t["key"], t["round"], t["result"]) for t in status["tasks"]] == [("d", 1, 10),
                                                                                         ("again", 2, 20)]
                assert [(p["round"], p["results"]) for p in asked] == [(1, {"d": 10}), (2, {"again": 20})]
            finally:
                await service.stop()

    asyncio.run(scenario())


def test_cancel_running_task_cancels_the_handler_and_fails_dependants(meshd_factory: MeshdFactory,
                                                                     tmp_path: Path) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])

    async def scenario() -> None:
        async with Agent("owner", socket=a.socket) as owner, \
                Agent("slow", socket=b.socket, capabilities=["slow"]) as slow:
            started = asyncio.Event()
            stopped = asyncio.Event()

            async def forever(task: TaskCall) -> Any:
                started.set()
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    stopped.set()
                    raise

            TaskWorker(slow, forever)
            await wait_listed(owner, "slow")
            events = Events()
            service = TaskService(owner, tmp_path / "tasks.db", settings(), emit=events)
            await service.start()
            try:
                plan = await service.create_plan(creator="owner", tasks=[
                    {"id": "long", "title": "long", "capability": "slow"},
                    {"id": "next", "title": "next", "capability": "slow", "deps": ["long"]}])
                await asyncio.wait_for(started.wait(), 10)
                long_id = next(t["id"] for t in plan["tasks"] if t["key"] == "long")
                record = service.cancel_task(long_id, by="owner")
                assert record["state"] == "cancelled" and record["error"] == "cancelled by owner"
                await asyncio.wait_for(stopped.wait(), 10)  # the worker's handler was cancelled
                status = service.plan_status(plan["id"])
                assert status["state"] == "failed"
                assert [(t["key"], t["state"]) for t in status["tasks"]] == [("long", "cancelled"),
                                                                            ("next", "failed")]
                assert service.cancel_task(long_id, by="again")["error"] == "cancelled by owner"
                assert ("task.cancelled", "owner") in [(n, d.get("by")) for n, d in events.items]
            finally:
                await service.stop()

    asyncio.run(scenario())


def test_graceful_stop_mid_task_then_restart_runs_the_handler_once(meshd_factory: MeshdFactory,
                                                                   tmp_path: Path) -> None:
    a = meshd_factory.spawn("a")

    async def scenario() -> None:
        async with Agent("owner", socket=a.socket) as owner, \
                Agent("worker", socket=a.socket, capabilities=["slow"]) as worker:
            started = asyncio.Event()
            release = asyncio.Event()

            async def slow(task: TaskCall) -> Any:
                started.set()
                await release.wait()
                return "finished"

            tw = TaskWorker(worker, slow)
            await wait_listed(owner, "worker")
            first = TaskService(owner, tmp_path / "tasks.db", settings())
            await first.start()
            rec = await first.create_task(creator="owner", title="slow", input=None, capability="slow")
            await asyncio.wait_for(started.wait(), 10)
            await first.stop()  # the daemon stops while the worker is busy with the task
            release.set()
            await async_wait_until(lambda: tw.done == 1, what="the worker to finish the first run")
            second = TaskService(owner, tmp_path / "tasks.db", settings())
            await second.start()
            try:
                assert second.task_status(rec["id"])["state"] == "running"  # resumed, same attempt
                done = await second.wait_task(rec["id"], 10)
                assert done["state"] == "done" and done["result"] == "finished" and done["attempts"] == 1
                assert (tw.runs, tw.replayed) == (1, 1)  # answered from the window, not run again
            finally:
                await second.stop()

    asyncio.run(scenario())
