"""Tasks without sockets: plan compilation, load ordering, the store's bound and durability, and the
two hooks (task events reach observers; a plugin can replace the spawner, or stop start-up)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from meshd.config.settings import Settings
from meshd.errors import DaemonUnreachable, TaskStoreFull, ValidationFailed
from meshd.hookspecs import hookimpl
from meshd.plugins.host import PluginHost
from meshd.tasks import TaskService
from meshd.tasks.plans import compile_plan, plan_state
from meshd.tasks.scheduler import Directory, agent_load
from meshd.tasks.store import TaskStore
from meshd.tools.spawn import Spawner, make_spawner


def task(key: str, *deps: str) -> dict[str, Any]:
    return {"id": key, "title": key, "capability": "c", "deps": list(deps)}


def test_plan_order_puts_deps_first() -> None:
    items = compile_plan([task("c", "a", "b"), task("b", "a"), task("a")], max_tasks=10)
    assert [i.key for i in items] == ["a", "b", "c"]
    assert items[2].deps == ("a", "b")


def test_plan_cycle_named_as_a_path() -> None:
    with pytest.raises(ValidationFailed, match="dependency cycle b -> d -> c -> b"):
        compile_plan([task("a"), task("b", "d"), task("c", "b"), task("d", "c")], max_tasks=10)
    with pytest.raises(ValidationFailed, match="depends on itself"):
        compile_plan([task("a", "a")], max_tasks=10)
    with pytest.raises(ValidationFailed, match="at least one task"):
        compile_plan([], max_tasks=10)
    with pytest.raises(ValidationFailed, match=r"tasks\[0\]\.deps"):
        compile_plan([{"id": "a", "title": "a", "capability": "c", "deps": "b"}], max_tasks=10)


def test_plan_state() -> None:
    assert plan_state(["done", "done"]) == "done"
    assert plan_state(["done", "running"]) == "running"
    assert plan_state(["done", "failed", "failed"]) == "failed"
    assert plan_state(["cancelled", "done"]) == "cancelled"


def test_agent_load_orders_by_load_then_context() -> None:
    def rec(name: str, **tele: Any) -> dict[str, Any]:
        return {"name": name, "telemetry": tele}
    agents = [rec("a", queue_depth=3), rec("b", queue_depth=1, context_used_pct=90),
              rec("c", queue_depth=1, context_used_pct=10), rec("d", tasks_summary={"running": 5}),
              rec("e", tasks_summary=[{"title": "x", "status": "in_progress"}] * 2)]
    assert [a["name"] for a in sorted(agents, key=agent_load)] == ["c", "b", "e", "a", "d"]
    # our own dispatches in flight count when the telemetry is older than they are
    assert agent_load(rec("c", queue_depth=1), in_flight=4)[0] == 4


def test_store_bound_prunes_finished_then_refuses(tmp_path: Path) -> None:
    store = TaskStore(tmp_path / "t.db", max_tasks=10)
    for i in range(10):
        store.add_task({"id": f"t{i}", "state": "done" if i < 3 else "running"})
    store.flush()
    store.reserve(2)  # two oldest finished ones make room
    assert "t0" not in store.tasks and "t1" not in store.tasks and "t2" in store.tasks
    with pytest.raises(TaskStoreFull, match="only 1 are finished"):
        store.reserve(4)
    store.close()
    again = TaskStore(tmp_path / "t.db", max_tasks=10)
    assert sorted(again.tasks) == sorted(f"t{i}" for i in range(2, 10))
    again.close()


def test_store_commit_is_shared_by_one_loop_turn(tmp_path: Path) -> None:
    async def scenario() -> int:
        store = TaskStore(tmp_path / "t.db", max_tasks=100)
        for i in range(20):
            store.add_task({"id": f"t{i}", "state": "ready"})
        await asyncio.gather(*(store.commit() for _ in range(20)))
        commits = store.commits
        store.close()
        return commits
    assert asyncio.run(scenario()) == 1


class Watcher:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    @hookimpl
    def meshd_task_event(self, event: str, data: dict[str, Any]) -> None:
        self.seen.append((event, data))


def test_task_events_reach_observers() -> None:
    host = PluginHost(load_entrypoints=False, environ={})
    watcher = Watcher()
    host.register(watcher, name="watcher")
    host.start()
    host.task_event("task.done", {"id": "t-1", "state": "done"})
    host.stop()
    assert watcher.seen == [("task.done", {"id": "t-1", "state": "done"})]


class OwnSpawner:
    @hookimpl
    def meshd_spawner(self, settings: Any, socket_path: Any, emit: Any) -> Any:
        return ("custom", socket_path)


class BrokenSpawner:
    @hookimpl
    def meshd_spawner(self, settings: Any) -> Any:
        raise OSError("no container runtime")


def test_spawner_hook_replaces_or_stops(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    host = PluginHost(load_entrypoints=False, environ={})
    assert isinstance(make_spawner(settings, tmp_path / "s.sock", None, host), Spawner)
    host.register(OwnSpawner(), name="own")
    assert make_spawner(settings, tmp_path / "s.sock", None, host) == ("custom", tmp_path / "s.sock")
    broken = PluginHost(load_entrypoints=False, environ={})
    broken.register(BrokenSpawner(), name="broken")
    with pytest.raises(RuntimeError, match="plugin broken failed in meshd_spawner: no container runtime"):
        make_spawner(settings, tmp_path / "s.sock", None, broken)


class FlakyDirectory:
    """An agent whose daemon answers the directory query once, then stops answering."""

    name = "owner"

    def __init__(self) -> None:
        self.calls = 0

    async def agents(self) -> list[dict[str, Any]]:
        self.calls += 1
        if self.calls > 1:
            raise DaemonUnreachable("meshd did not answer")
        return [{"name": "w", "state": "online", "capabilities": ["c"]}]


def test_directory_keeps_the_last_view_when_the_daemon_does_not_answer() -> None:
    async def scenario() -> None:
        flaky = FlakyDirectory()
        directory = Directory(flaky, refresh=0.01)
        assert set(await directory.snapshot()) == {"w"}
        await asyncio.sleep(0.02)
        assert set(await directory.snapshot()) == {"w"}  # stale, but a task waiting on it goes on
        assert flaky.calls == 2
    asyncio.run(scenario())


def test_restart_finishes_a_cascade_the_crash_cut_short(tmp_path: Path) -> None:
    store = TaskStore(tmp_path / "tasks.db", max_tasks=100)
    store.add_plan({"id": "p-1", "creator": "c", "state": "running", "tasks": ["t-a", "t-b"], "rounds": 1,
                    "round": 1, "deadline": 1e12, "error": None})
    base = {"capability": "c", "creator": "c", "plan_id": "p-1", "round": 1, "attempts": 0, "title": "x"}
    store.add_task({**base, "id": "t-a", "key": "a", "state": "failed", "deps": [], "error": "boom"})
    store.add_task({**base, "id": "t-b", "key": "b", "state": "pending", "deps": ["t-a"]})
    store.close()

    async def scenario() -> dict[str, Any]:
        service = TaskService(None, tmp_path / "tasks.db", Settings(state_dir=tmp_path))
        await service.start()
        try:
            return service.plan_status("p-1")
        finally:
            await service.stop()

    status = asyncio.run(scenario())
    assert status["state"] == "failed"
    assert [(t["key"], t["state"], t["error"]) for t in status["tasks"]] == [
        ("a", "failed", "boom"), ("b", "failed", "dependency 'a' failed")]
