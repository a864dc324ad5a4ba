"""Process isolation: a plugin with ``isolation = "process"`` runs in a real child process, gets the
same hooks and the same accounting, is restarted when it dies and never outlives the host.

No daemon here (tests/integration/test_plugins_daemon.py has those): a PluginHost fed directly,
with a real spawned child per plugin.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from meshd.errors import ConfigError
from meshd.hookspecs import hookimpl
from meshd.plugins.host import PluginHost
from meshd.plugins.process import NodeSnapshot
from meshd.testing import wait_until

CHILD_PLUGIN = """
    import json, os, sys
    from pydantic import BaseModel
    from meshd.hookspecs import hookimpl

    class Settings(BaseModel):
        out: str
        fail_on: str = ""

    _out = None

    def _emit(**fields):
        with open(_out, "a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), **fields}) + "\\n")

    @hookimpl
    def meshd_plugin_config():
        return Settings

    @hookimpl
    def meshd_configure(config):
        global _out, _fail_on
        _out, _fail_on = config.out, config.fail_on
        _emit(hook="configure")

    @hookimpl
    def meshd_startup(node):
        _emit(hook="startup", node=node.node_id, mesh=node.mesh, info=node.info())

    @hookimpl
    def meshd_collaboration(outcome):
        if outcome["id"] == _fail_on:
            raise RuntimeError("plugin bug")
        if outcome["id"] == "slow":
            import asyncio
            return asyncio.sleep(30)  # an awaitable the child awaits with the hook timeout
        if outcome["id"] == "exit":
            os._exit(3)  # a crash: the child dies without cleaning up
        _emit(hook="collaboration", id=outcome["id"])

    @hookimpl
    def meshd_shutdown(node):
        _emit(hook="shutdown", node=node.node_id)
"""


def _outcome(i: Any) -> dict[str, Any]:
    return {"kind": "send", "id": str(i), "initiator": "a", "target": "b", "topic": None, "outcome": "sent",
            "error_code": None, "latency_ms": None, "qos": 0, "at": 0.0}


class FakeNode:
    node_id = "n1"
    name = "host1"
    mesh = "m"

    def info(self) -> dict[str, Any]:
        return {"node": self.node_id, "agents": 0}


@pytest.fixture
def child_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "meshd_test_child.py").write_text(textwrap.dedent(CHILD_PLUGIN))
    monkeypatch.syspath_prepend(str(site))
    yield tmp_path / "out.jsonl"
    sys.modules.pop("meshd_test_child", None)


@pytest.fixture
def make_host() -> Iterator[Callable[..., PluginHost]]:
    hosts: list[PluginHost] = []

    def make(**kwargs: Any) -> PluginHost:
        host = PluginHost(["meshd_test_child"], load_entrypoints=False, environ={}, **kwargs)
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        host.stop(timeout=5)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_hooks_run_in_a_child_with_the_same_accounting(make_host: Callable[..., PluginHost],
                                                       child_plugin: Path) -> None:
    host = make_host(hook_timeout=0.3,
                     sections={"meshd_test_child": {"isolation": "process", "out": str(child_plugin),
                                                    "fail_on": "2"}})
    host.load()
    assert host.options["meshd_test_child"].isolation == "process"
    assert not child_plugin.exists()  # not configured in the daemon's process: only in the child
    asyncio.run(host.startup(FakeNode()))
    host.start()
    for i in [0, 1, 2, "slow", 3, 4]:
        host.collaboration(_outcome(i))
    wait_until(lambda: host.stats["called"] >= 8, what="the child's counts")  # configure, startup, 6
    assert host.stats["failed:meshd_test_child"] == 1
    assert host.stats["timed_out:meshd_test_child"] == 1
    asyncio.run(host.shutdown(FakeNode()))
    events = _lines(child_plugin)
    assert [e["hook"] for e in events] == ["configure", "startup"] + ["collaboration"] * 4 + ["shutdown"]
    assert {e["pid"] for e in events} != {os.getpid()} and len({e["pid"] for e in events}) == 1
    assert [e["id"] for e in events if e["hook"] == "collaboration"] == ["0", "1", "3", "4"]
    assert events[1]["node"] == "n1" and events[1]["mesh"] == "m" and events[1]["info"]["node"] == "n1"
    assert host.stats["called"] == 9


def test_a_child_that_dies_is_restarted_and_counted(make_host: Callable[..., PluginHost],
                                                    child_plugin: Path) -> None:
    host = make_host(sections={"meshd_test_child": {"isolation": "process", "out": str(child_plugin)}})
    host.load()
    host.start()
    host.collaboration(_outcome("before"))
    wait_until(lambda: any(e.get("id") == "before" for e in _lines(child_plugin)), what="first event")
    first_pid = _lines(child_plugin)[0]["pid"]
    host.collaboration(_outcome("exit"))
    wait_until(lambda: host.stats["restarted:meshd_test_child"] == 1, timeout=15, what="a restart")
    host.collaboration(_outcome("after"))
    wait_until(lambda: any(e.get("id") == "after" for e in _lines(child_plugin)), timeout=15,
               what="an event reaching the new child")
    pids = [e["pid"] for e in _lines(child_plugin)]
    assert pids[0] == first_pid and pids[-1] != first_pid
    # the new child was configured again before its first event
    assert next(e["hook"] for e in _lines(child_plugin) if e["pid"] == pids[-1]) == "configure"


def test_a_busy_child_fills_its_own_queue_and_is_ended_at_stop(make_host: Callable[..., PluginHost],
                                                              child_plugin: Path) -> None:
    host = make_host(sections={"meshd_test_child": {"isolation": "process", "out": str(child_plugin),
                                                    "queue_size": 3}})
    host.load()  # not started: nothing takes events from the queue
    for i in range(10):
        host.collaboration(_outcome(i))
    wait_until(lambda: host.stats["dropped:meshd_test_child"] == 7, what="drops past the bound")
    assert host.stats["dropped"] == 7
    host.stop(timeout=1)
    host.collaboration(_outcome("late"))
    assert host.stats["dropped:meshd_test_child"] == 8


def test_the_child_dies_with_its_parent(tmp_path: Path, child_plugin: Path) -> None:
    # A throwaway parent process hosts the plugin; SIGKILL it and the child must go too.
    script = tmp_path / "parent.py"
    site = str(child_plugin.parent / "site")
    sections = {"meshd_test_child": {"isolation": "process", "out": str(child_plugin)}}
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {site!r})
        from meshd.plugins import PluginHost

        if __name__ == "__main__":  # multiprocessing's spawn imports the main module again
            host = PluginHost(["meshd_test_child"], load_entrypoints=False, environ={{}},
                              sections={sections!r})
            host.load()
            host.start()
            host.collaboration({{"id": "hello"}})
            time.sleep(600)
    """))
    parent = subprocess.Popen([sys.executable, str(script)])
    try:
        wait_until(lambda: any(e.get("id") == "hello" for e in _lines(child_plugin)), timeout=30,
                   what="the child's first event")
        child_pid = _lines(child_plugin)[-1]["pid"]
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)

        def child_gone() -> bool:
            try:
                os.kill(child_pid, 0)
            except ProcessLookupError:
                return True
            # a zombie (reaped by init later) counts as gone
            with open(f"/proc/{child_pid}/stat") as fh:
                return fh.read().split(") ", 1)[1].startswith("Z")
        wait_until(child_gone, timeout=10, what="the orphaned plugin child to exit")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(5)


def test_an_object_plugin_cannot_run_in_a_process() -> None:
    class Obj:
        @hookimpl
        def meshd_collaboration(self, outcome: dict[str, Any]) -> None:
            pass

    host = PluginHost(load_entrypoints=False, environ={}, sections={"obj": {"isolation": "process"}})
    with pytest.raises(ConfigError) as err:
        host.register(Obj(), "obj")
    assert err.value.key == "plugins.obj.isolation"
    assert host.list_plugins() == []


def test_node_snapshot_is_a_node_view() -> None:
    from meshd.view import NodeView

    snap = NodeSnapshot("n", "host", "m", info_at_start={"node": "n"}, agents_at_start=[{"name": "x"}])
    assert isinstance(snap, NodeView)
    assert snap.agents() == [{"name": "x"}] and snap.peers() == []
    assert snap.metrics_snapshot().node_id == "n"
