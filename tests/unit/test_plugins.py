"""PluginHost: loading in isolation, blocking, the observer queue and worker thread, lifecycle hooks,
the built-in JSONL dead-letter sink, and the example third-party distribution. No daemons.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from meshd.errors import ConfigError
from meshd.hookspecs import hookimpl
from meshd.plugins.builtin import JsonlDeadLetterSink
from meshd.plugins.host import AUTOLOAD_ENV, BLOCKED_ENV, PluginHost

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_DIR = REPO / "plugins" / "meshd-example-observer"
ALL_HOOKS = ["meshd_agent_state", "meshd_collaboration", "meshd_dead_letter", "meshd_peer_state",
             "meshd_shutdown", "meshd_startup"]


def _outcome(i: object = 0, **extra: Any) -> dict[str, Any]:
    return {"kind": "send", "id": str(i), "initiator": "planner", "target": "researcher", "topic": "t",
            "outcome": "sent", "error_code": None, "latency_ms": None, "qos": 0, "at": time.time(), **extra}


def _letter(seq: int = 1, **extra: Any) -> dict[str, Any]:
    letter = {"seq": seq, "at": time.time(), "reason": "PEER_UNREACHABLE", "detail": "peer b is offline",
              "attempts": 3, "header": {"kind": "direct", "id": f"m{seq}", "to": "researcher"},
              "frames": [b"MESH\x01", b"\x83\xa4kind", b"payload\x00\xff"]}
    letter.update(extra)
    return letter


class Recorder:
    """Records every observer call it gets, from whichever thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.threads: set[str] = set()

    def _record(self, hook: str, data: Any) -> None:
        self.calls.append((hook, data))
        self.threads.add(threading.current_thread().name)

    @hookimpl
    def meshd_collaboration(self, outcome: dict[str, Any]) -> None:
        self._record("collaboration", outcome)

    @hookimpl
    def meshd_dead_letter(self, letter: dict[str, Any]) -> None:
        self._record("dead_letter", letter)

    @hookimpl
    def meshd_peer_state(self, peer: dict[str, Any], old: str, new: str) -> None:
        self._record("peer_state", (peer, old, new))

    @hookimpl
    def meshd_agent_state(self, agent: dict[str, Any], old: str, new: str) -> None:
        self._record("agent_state", (agent, old, new))


@pytest.fixture
def make_host() -> Iterator[Callable[..., PluginHost]]:
    """PluginHost factory (no entry points, empty environment unless given); stops them at the end."""
    hosts: list[PluginHost] = []

    def make(*modules: str, **kwargs: Any) -> PluginHost:
        kwargs.setdefault("load_entrypoints", False)
        kwargs.setdefault("environ", {})
        host = PluginHost(modules, **kwargs)
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        host.stop(timeout=2)


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path for throwaway plugin modules (named meshd_test_*), removed afterwards."""
    path = tmp_path / "site"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    yield path
    for name in [name for name in sys.modules if name.startswith("meshd_test_")]:
        del sys.modules[name]


def _write_module(directory: Path, name: str, source: str) -> None:
    (directory / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")


GOOD_MODULE = """
    from meshd.hookspecs import hookimpl

    calls = []

    @hookimpl
    def meshd_collaboration(outcome):
        calls.append(outcome["id"])
"""


def _wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


# -- isolation on the worker thread -------------------------------------------------------------


def test_a_raising_plugin_does_not_stop_the_next_one(make_host: Callable[..., PluginHost]) -> None:
    order: list[str] = []

    class Raiser:
        @hookimpl(tryfirst=True)  # called first: pluggy alone would never reach the next plugin
        def meshd_collaboration(self, outcome: dict[str, Any]) -> None:
            order.append("raiser")
            raise RuntimeError("plugin bug")

        @hookimpl
        def meshd_agent_state(self, agent: dict[str, Any]) -> None:
            order.append("raiser-agent")
            raise SystemExit(1)  # must not end the worker thread either

    class Good:
        @hookimpl
        def meshd_collaboration(self, outcome: dict[str, Any]) -> None:
            order.append("good")

        @hookimpl
        def meshd_agent_state(self, agent: dict[str, Any]) -> None:
            order.append("good-agent")

    host = make_host()
    host.register(Good(), "good")
    host.register(Raiser(), "raiser")
    host.start()
    for i in range(3):
        host.collaboration(_outcome(i))
    host.agent_state({"name": "a", "node": "n", "capabilities": []}, "absent", "online")
    host.stop(timeout=10)

    # each plugin has its own worker: per plugin, every event in order
    assert [o for o in order if o.startswith("raiser")] == ["raiser"] * 3 + ["raiser-agent"]
    assert [o for o in order if not o.startswith("raiser")] == ["good"] * 3 + ["good-agent"]
    assert host.stats["failed:raiser"] == 4
    assert host.stats["failed:good"] == 0
    assert host.stats["called"] == 8


def test_each_plugin_gets_its_own_copy(make_host: Callable[..., PluginHost]) -> None:
    seen: list[dict[str, Any]] = []

    class Mutator:
        @hookimpl(tryfirst=True)
        def meshd_agent_state(self, agent: dict[str, Any]) -> None:
            agent["name"] = "changed"
            agent["capabilities"].append("changed")

    class Reader:
        @hookimpl
        def meshd_agent_state(self, agent: dict[str, Any]) -> None:
            seen.append(agent)

    host = make_host()
    host.register(Reader(), "reader")
    host.register(Mutator(), "mutator")
    agent: dict[str, Any] = {"name": "researcher", "node": "n1", "capabilities": ["search"]}
    host.agent_state(agent, "absent", "online")
    agent["capabilities"].append("caller edit after the call")  # the queued event is a copy too
    host.start()
    host.stop(timeout=10)
    assert seen == [{"name": "researcher", "node": "n1", "capabilities": ["search"]}]


def test_a_blocking_plugin_never_blocks_the_caller(make_host: Callable[..., PluginHost]) -> None:
    entered = threading.Event()
    returned = threading.Event()
    received: list[str] = []

    class Sleeper:
        @hookimpl
        def meshd_collaboration(self, outcome: dict[str, Any]) -> None:
            if not entered.is_set():
                entered.set()
                time.sleep(2)
                returned.set()
            received.append(outcome["id"])

    host = make_host()
    host.register(Sleeper(), "sleeper")
    host.start()
    host.collaboration(_outcome("first"))
    assert entered.wait(5), "the worker never called the plugin"

    started = time.monotonic()
    calls = 0
    for i in range(10_000):
        host.collaboration(_outcome(i))
        calls += 1
    elapsed = time.monotonic() - started

    # Ordering, not a stopwatch: every call returned while the plugin was still asleep.
    assert calls == 10_000
    assert not returned.is_set(), f"10,000 calls took {elapsed:.2f} s: they waited for the sleeping plugin"
    assert host.stats["dropped"] == 0  # the default queue (10,000) holds them all
    host.stop(timeout=30)
    assert returned.is_set()
    assert len(received) == 10_001
    assert received[:2] == ["first", "0"] and received[-1] == "9999"


def test_full_queue_drops_are_counted_and_logged_once_per_1000(
        make_host: Callable[..., PluginHost], caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder()
    host = make_host(queue_size=5)
    host.register(recorder, "recorder")
    with caplog.at_level(logging.WARNING, logger="meshd.plugins"):
        for i in range(5 + 1002):  # not started: nothing drains the queue
            host.collaboration(_outcome(i))
    assert host.stats["dropped"] == 1002
    assert host.queued == 5
    drop_logs = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert len(drop_logs) == 2  # at the 1st and the 1001st drop
    host.start()
    host.stop(timeout=10)
    assert [data["id"] for _, data in recorder.calls] == ["0", "1", "2", "3", "4"]


def test_hooks_nobody_implements_cost_nothing(make_host: Callable[..., PluginHost]) -> None:
    host = make_host(queue_size=1)
    for i in range(10):
        host.collaboration(_outcome(i))
        host.dead_letter(_letter(i))
    assert host.queued == 0
    assert host.stats["dropped"] == 0


def test_observer_methods_never_raise(make_host: Callable[..., PluginHost]) -> None:
    class Hostile(Mapping[str, Any]):
        def __getitem__(self, key: str) -> Any:
            raise RuntimeError("cannot copy me")

        def __iter__(self) -> Iterator[str]:
            raise RuntimeError("cannot copy me")

        def __len__(self) -> int:
            return 1

    host = make_host()
    host.register(Recorder(), "recorder")
    host.collaboration(Hostile())
    assert host.stats["dropped"] == 1


def test_all_observer_hooks_reach_the_worker_thread(make_host: Callable[..., PluginHost]) -> None:
    recorder = Recorder()
    host = make_host()
    host.register(recorder, "recorder")
    host.start()
    host.collaboration(_outcome(1))
    host.dead_letter(_letter(1))
    host.peer_state({"node": "n2", "name": "b", "state": "stale", "router": "tcp://10.0.0.2:7700"},
                    "online", "stale")
    host.agent_state({"name": "researcher", "node": "n2", "capabilities": ["search"]}, "online", "stale")
    host.stop(timeout=10)
    assert [hook for hook, _ in recorder.calls] == ["collaboration", "dead_letter", "peer_state",
                                                    "agent_state"]
    assert recorder.calls[1][1]["frames"] == _letter(1)["frames"]
    assert recorder.calls[2][1][1:] == ("online", "stale")
    assert recorder.threads == {"meshd-plugin-recorder"}  # its own worker thread


def test_unregister_stops_the_hooks_and_tells_the_listener(make_host: Callable[..., PluginHost]) -> None:
    host = make_host()
    changes: list[bool] = []
    host.on_change = lambda: changes.append(host.wants("meshd_collaboration"))
    first = Recorder()
    host.register(first, "watcher")
    host.start()
    assert changes == [True] and host.wants("meshd_collaboration")
    host.collaboration(_outcome(1))
    assert _wait_for(lambda: len(first.calls) == 1)
    assert host.unregister("watcher") is True
    assert changes == [True, False] and not host.wants("meshd_collaboration")
    host.collaboration(_outcome(2))  # nobody observes: not offered at all
    assert host.unregister("watcher") is False  # not registered (any more)
    # the same name again, another object: its own worker, never the old object's hooks
    second = Recorder()
    host.register(second, "watcher")
    host.collaboration(_outcome(3))
    assert _wait_for(lambda: len(second.calls) == 1)
    assert [c[1]["id"] for c in first.calls] == [_outcome(1)["id"]]
    assert [c[1]["id"] for c in second.calls] == [_outcome(3)["id"]]


def test_async_hook_impls_are_awaited_in_the_worker_loop(make_host: Callable[..., PluginHost]) -> None:
    done: list[tuple[str, str, str]] = []
    loops: set[int] = set()

    class AsyncPlugin:
        @hookimpl
        async def meshd_agent_state(self, agent: dict[str, Any], old: str, new: str) -> None:
            await asyncio.sleep(0.01)
            loops.add(id(asyncio.get_running_loop()))
            done.append((agent["name"], old, new))

    host = make_host()
    host.register(AsyncPlugin(), "async_plugin")
    host.start()
    host.agent_state({"name": "a", "node": "n", "capabilities": []}, "absent", "online")
    host.agent_state({"name": "a", "node": "n", "capabilities": []}, "online", "offline")
    host.stop(timeout=10)
    assert done == [("a", "absent", "online"), ("a", "online", "offline")]
    assert len(loops) == 1  # one loop for the worker thread, kept across calls
    assert host.stats["failed:async_plugin"] == 0


def test_async_impl_timeouts_are_counted_and_the_others_still_run(
        make_host: Callable[..., PluginHost]) -> None:
    cancelled: list[str] = []
    recorder = Recorder()

    class Slow:
        @hookimpl(tryfirst=True)
        async def meshd_peer_state(self, peer: dict[str, Any], new: str) -> None:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(peer["node"])
                raise

    host = make_host(hook_timeout=0.2)
    host.register(recorder, "recorder")
    host.register(Slow(), "slow")
    host.start()
    for node in ("n1", "n2"):
        host.peer_state({"node": node, "name": node, "state": "offline", "router": ""}, "online", "offline")
    host.stop(timeout=10)
    assert host.stats["timed_out:slow"] == 2
    assert cancelled == ["n1", "n2"]
    assert [data[0]["node"] for _, data in recorder.calls] == ["n1", "n2"]


def test_stop_is_bounded_by_its_timeout(make_host: Callable[..., PluginHost]) -> None:
    release = threading.Event()
    entered = threading.Event()

    class Stuck:
        @hookimpl
        def meshd_collaboration(self, outcome: dict[str, Any]) -> None:
            entered.set()
            release.wait(10)

    host = make_host()
    host.register(Stuck(), "stuck")
    host.start()
    for i in range(5):
        host.collaboration(_outcome(i))
    assert entered.wait(5)
    started = time.monotonic()
    host.stop(timeout=0.3)
    assert time.monotonic() - started < 2.5
    host.collaboration(_outcome("late"))  # after stop: dropped, not queued
    assert host.stats["dropped"] == 1
    release.set()
    assert _wait_for(lambda: host.stats["abandoned"] == 4), host.stats
    assert host.stats["abandoned:stuck"] == 4 and host.stats["dropped:stuck"] == 1


# -- lifecycle hooks in the caller's loop -------------------------------------------------------


def test_startup_and_shutdown_are_isolated_and_awaited(make_host: Callable[..., PluginHost]) -> None:
    order: list[str] = []
    loops: list[asyncio.AbstractEventLoop] = []
    the_node = object()

    class A:
        @hookimpl
        def meshd_startup(self, node: Any) -> None:
            order.append("a-start" if node is the_node else "a-start with the wrong node")

        @hookimpl
        def meshd_shutdown(self) -> None:
            order.append("a-stop")

    class B:
        @hookimpl
        async def meshd_startup(self, node: Any) -> None:
            await asyncio.sleep(0.01)
            loops.append(asyncio.get_running_loop())
            order.append("b-start")

        @hookimpl
        def meshd_shutdown(self, node: Any) -> None:
            order.append("b-stop")
            raise RuntimeError("shutdown bug")

    class C:
        @hookimpl
        async def meshd_startup(self, node: Any) -> None:
            order.append("c-start")
            await asyncio.sleep(30)

        @hookimpl
        async def meshd_shutdown(self, node: Any) -> None:
            order.append("c-stop")

    host = make_host(hook_timeout=0.2)
    host.register(A(), "a")
    host.register(B(), "b")
    host.register(C(), "c")

    async def main() -> asyncio.AbstractEventLoop:
        await host.startup(the_node)
        await host.shutdown(the_node)
        return asyncio.get_running_loop()

    loop = asyncio.run(main())
    # pluggy's order for start-up (last registered first), the reverse for shutdown
    assert order == ["c-start", "b-start", "a-start", "a-stop", "b-stop", "c-stop"]
    assert loops == [loop]  # awaited in the node's loop, not the worker's
    assert host.stats["timed_out:c"] == 1
    assert host.stats["failed:b"] == 1
    assert host.stats["failed:a"] == 0


# -- loading ------------------------------------------------------------------------------------


def test_a_module_that_fails_to_load_is_counted_and_the_others_load(
        make_host: Callable[..., PluginHost], plugin_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    _write_module(plugin_dir, "meshd_test_good", GOOD_MODULE)
    _write_module(plugin_dir, "meshd_test_broken", "raise RuntimeError('broken at import')\n")
    _write_module(plugin_dir, "meshd_test_exits", "raise SystemExit(3)\n")
    _write_module(plugin_dir, "meshd_test_badspec", """
        from meshd.hookspecs import hookimpl

        @hookimpl
        def meshd_collaboration(outcome):
            pass

        @hookimpl
        def meshd_peer_state(peer, no_such_argument):
            pass
    """)
    modules = ["meshd_test_broken", "meshd_test_missing", "meshd_test_exits", "meshd_test_badspec",
               "meshd_test_good"]
    host = make_host(*modules)
    with caplog.at_level(logging.ERROR, logger="meshd.plugins"):
        host.load()

    for name in modules[:4]:
        assert host.stats[f"load_failed:{name}"] == 1, name
        assert any(name in r.getMessage() for r in caplog.records), f"no log line names {name}"
    assert "load_failed:meshd_test_good" not in host.stats
    status = {p["name"]: p["status"] for p in host.list_plugins()}
    assert status == {**dict.fromkeys(modules[:4], "failed"), "meshd_test_good": "loaded"}
    # the half-registered plugin (its first hook was fine) is gone entirely
    impls = host.pm.hook.meshd_collaboration.get_hookimpls()
    assert [impl.plugin_name for impl in impls] == ["meshd_test_good"]

    host.start()
    host.collaboration(_outcome("x"))
    host.stop(timeout=10)
    assert sys.modules["meshd_test_good"].calls == ["x"]


def test_entry_points_load_in_isolation(make_host: Callable[..., PluginHost], plugin_dir: Path) -> None:
    dist_info = plugin_dir / "meshd_fake_plugins-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: meshd-fake-plugins\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(
        "[meshd]\nfake_broken = meshd_test_ep_broken\nfake_good = meshd_test_ep_good\n")
    _write_module(plugin_dir, "meshd_test_ep_broken", "import meshd_test_no_such_dependency\n")
    _write_module(plugin_dir, "meshd_test_ep_good", GOOD_MODULE)

    host = make_host(load_entrypoints=True)
    host.load()
    plugins = {p["name"]: p for p in host.list_plugins()}
    assert plugins["fake_broken"]["status"] == "failed"
    assert "meshd_test_no_such_dependency" in plugins["fake_broken"]["error"]
    assert host.stats["load_failed:fake_broken"] == 1
    assert plugins["fake_good"] == {"name": "fake_good", "status": "loaded", "module": "meshd_test_ep_good",
                                    "dist": "meshd-fake-plugins 1.0", "hooks": ["meshd_collaboration"],
                                    "error": None, "isolation": "thread", "queue_size": 10_000}


def test_autoload_off_loads_no_entry_point_but_the_configured_modules(
        make_host: Callable[..., PluginHost], plugin_dir: Path) -> None:
    dist_info = plugin_dir / "meshd_fake_autoload-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: meshd-fake-autoload\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text("[meshd]\nfake_autoload_ep = meshd_test_autoload_ep\n")
    _write_module(plugin_dir, "meshd_test_autoload_ep", GOOD_MODULE)
    _write_module(plugin_dir, "meshd_test_autoload_mod", GOOD_MODULE)

    host = make_host("meshd_test_autoload_mod", load_entrypoints=True, environ={AUTOLOAD_ENV: "1"})
    host.load()
    assert "meshd_test_autoload_ep" not in sys.modules
    assert [p["name"] for p in host.list_plugins()] == ["meshd_test_autoload_mod"]
    on = make_host(load_entrypoints=True, environ={AUTOLOAD_ENV: "0"})
    on.load()
    assert "fake_autoload_ep" in {p["name"] for p in on.list_plugins()}


def test_blocked_plugins_are_not_even_imported(
        make_host: Callable[..., PluginHost], plugin_dir: Path) -> None:
    dist_info = plugin_dir / "meshd_fake_blocked-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: meshd-fake-blocked\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text("[meshd]\nfake_blocked_ep = meshd_test_blocked_ep\n")
    _write_module(plugin_dir, "meshd_test_blocked_ep", GOOD_MODULE)
    _write_module(plugin_dir, "meshd_test_blocked_mod", GOOD_MODULE)
    _write_module(plugin_dir, "meshd_test_allowed", GOOD_MODULE)

    host = make_host("meshd_test_blocked_mod", "meshd_test_allowed", load_entrypoints=True,
                     environ={BLOCKED_ENV: " fake_blocked_ep, meshd_test_blocked_mod ,recorder"})
    host.load()
    host.register(Recorder(), "recorder")  # built-ins can be blocked too

    assert "meshd_test_blocked_ep" not in sys.modules
    assert "meshd_test_blocked_mod" not in sys.modules
    status = {p["name"]: p["status"] for p in host.list_plugins()}
    assert status["fake_blocked_ep"] == status["meshd_test_blocked_mod"] == status["recorder"] == "blocked"
    assert status["meshd_test_allowed"] == "loaded"
    assert not [k for k in host.stats if k.startswith("load_failed")]


def test_unknown_hooks_are_logged_not_fatal(
        make_host: Callable[..., PluginHost], plugin_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    _write_module(plugin_dir, "meshd_test_typo", GOOD_MODULE + """
    @hookimpl
    def meshd_colaboration(outcome):
        pass
    """)
    host = make_host("meshd_test_typo")
    with caplog.at_level(logging.WARNING, logger="meshd.plugins"):
        host.load()
    assert any("meshd_colaboration" in r.getMessage() and "meshd_test_typo" in r.getMessage()
               for r in caplog.records)
    assert {p["name"]: p["status"] for p in host.list_plugins()} == {"meshd_test_typo": "loaded"}


def test_list_plugins_describes_registered_objects(make_host: Callable[..., PluginHost]) -> None:
    host = make_host()
    host.register(Recorder(), "recorder")
    (entry,) = host.list_plugins()
    assert entry == {"name": "recorder", "status": "loaded", "module": f"{__name__}.Recorder", "dist": None,
                     "hooks": ["meshd_agent_state", "meshd_collaboration", "meshd_dead_letter",
                               "meshd_peer_state"],
                     "error": None, "isolation": "thread", "queue_size": 10_000}


def test_register_rejects_a_plugin_that_does_not_match_the_specs(
        make_host: Callable[..., PluginHost]) -> None:
    class Wrong:
        @hookimpl
        def meshd_collaboration(self, outcome: dict[str, Any], extra: int) -> None:
            pass

    host = make_host()
    with pytest.raises(Exception, match="extra"):
        host.register(Wrong(), "wrong")
    assert host.list_plugins() == []


# -- the example distribution, installed like a third-party plugin ------------------------------


@pytest.fixture(scope="module")
def example_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """plugins/meshd-example-observer installed with pip into a fresh directory (offline)."""
    source = tmp_path_factory.mktemp("example-src") / EXAMPLE_DIR.name
    shutil.copytree(EXAMPLE_DIR, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp_path_factory.mktemp("example-site")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "--no-cache-dir", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PIP_NO_INPUT": "1"},
    )
    assert proc.returncode == 0, (
        "pip could not install the example plugin (building it offline needs setuptools and wheel, "
        f"or setuptools>=70.1, in the venv):\n{proc.stdout}\n{proc.stderr}")
    return target


def test_example_distribution_is_found_through_its_entry_point(
        example_site: Path, make_host: Callable[..., PluginHost], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "observer.jsonl"
    monkeypatch.delenv("MESHD_EXAMPLE_OBSERVER_OUT", raising=False)  # the file comes from its section
    monkeypatch.syspath_prepend(str(example_site))
    sys.modules.pop("meshd_example_observer", None)
    try:
        host = make_host(load_entrypoints=True,  # after sys.path has the install
                         sections={"example_observer": {"out": str(out)}})
        host.load()
        plugins = {p["name"]: p for p in host.list_plugins()}
        assert "example_observer" in plugins, plugins
        entry = plugins["example_observer"]
        assert entry["status"] == "loaded"
        assert entry["dist"] == "meshd-example-observer 0.1.0"
        assert entry["hooks"] == sorted([*ALL_HOOKS, "meshd_configure", "meshd_plugin_config"])
        module_file = Path(sys.modules["meshd_example_observer"].__file__ or "")
        assert module_file.parent == example_site

        class FakeNode:
            node_id = "0123456789abcdef"
            name = "host-a"

        node = FakeNode()
        asyncio.run(host.startup(node))
        host.start()
        host.collaboration(_outcome("m1", outcome="ok", latency_ms=1.5, kind="request"))
        host.dead_letter(_letter(7))
        host.peer_state({"node": "n2", "name": "b", "state": "online", "router": "tcp://127.0.0.1:7700"},
                        "offline", "online")
        host.agent_state({"name": "researcher", "node": "n2", "capabilities": ["search"]}, "absent", "online")
        host.stop(timeout=10)
        asyncio.run(host.shutdown(node))
    finally:
        sys.modules.pop("meshd_example_observer", None)

    assert not [k for k in host.stats if k.startswith(("failed", "timed_out", "load_failed"))], host.stats
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert Counter(line["hook"] for line in lines) == dict.fromkeys(ALL_HOOKS, 1)
    by_hook = {line["hook"]: line for line in lines}
    assert by_hook["meshd_startup"]["node"] == "0123456789abcdef"
    assert by_hook["meshd_collaboration"]["id"] == "m1"
    assert by_hook["meshd_collaboration"]["latency_ms"] == 1.5
    assert by_hook["meshd_dead_letter"]["seq"] == 7
    assert by_hook["meshd_dead_letter"]["frames"] == 3
    assert by_hook["meshd_peer_state"]["new"] == "online"
    assert by_hook["meshd_agent_state"]["old"] == "absent"


# -- the built-in JSONL dead-letter sink ---------------------------------------------------------


def test_jsonl_sink_writes_parseable_lines_with_base64_frames(
        make_host: Callable[..., PluginHost], tmp_path: Path) -> None:
    path = tmp_path / "deadletters.jsonl"
    sink = JsonlDeadLetterSink(path)
    host = make_host()
    host.register(sink, "jsonl_dead_letters")
    host.start()
    first = _letter(1, header={"kind": "direct", "id": "m1", "corr": b"\x01\x02", "headers": {"k": "v"}})
    host.dead_letter(first)
    host.dead_letter(_letter(2, reason="malformed:header", header=None, attempts=0, frames=[b"\xffjunk"]))
    host.stop(timeout=10)
    sink.close()

    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2
    record = json.loads(lines[0])
    assert "frames" not in record
    assert [base64.b64decode(frame) for frame in record["frames_b64"]] == first["frames"]
    assert record["header"] == {"kind": "direct", "id": "m1", "corr": base64.b64encode(b"\x01\x02").decode(),
                                "headers": {"k": "v"}}
    assert {k: record[k] for k in ("seq", "reason", "detail", "attempts")} == {
        "seq": 1, "reason": "PEER_UNREACHABLE", "detail": "peer b is offline", "attempts": 3}
    second = json.loads(lines[1])
    assert second["header"] is None and second["reason"] == "malformed:header"
    assert base64.b64decode(second["frames_b64"][0]) == b"\xffjunk"


def test_jsonl_sink_tightens_an_existing_file_to_0600(tmp_path: Path) -> None:
    path = tmp_path / "deadletters.jsonl"
    path.write_text('{"seq": 0}\n')
    path.chmod(0o644)
    sink = JsonlDeadLetterSink(path)
    sink.meshd_dead_letter(_letter(1))
    sink.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [json.loads(line)["seq"] for line in path.read_text().splitlines()] == [0, 1]


def test_jsonl_sink_logs_write_errors_once_and_recovers(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "missing-dir" / "deadletters.jsonl"
    sink = JsonlDeadLetterSink(path)
    with caplog.at_level(logging.ERROR):
        for seq in range(3):
            sink.meshd_dead_letter(_letter(seq))  # never raises
    assert sink.errors == 3
    assert len([r for r in caplog.records if str(path) in r.getMessage()]) == 1
    path.parent.mkdir()
    sink.meshd_dead_letter(_letter(9))
    sink.close()
    assert sink.written == 1
    assert json.loads(path.read_text())["seq"] == 9


# -- a queue per plugin ---------------------------------------------------------------------------


def test_a_blocked_plugin_never_starves_a_healthy_one(make_host: Callable[..., PluginHost]) -> None:
    release = threading.Event()
    healthy: list[str] = []

    class Blocker:
        @hookimpl
        def meshd_collaboration(self, outcome: dict[str, Any]) -> None:
            release.wait(30)

    class Healthy:
        @hookimpl
        def meshd_collaboration(self, outcome: dict[str, Any]) -> None:
            healthy.append(outcome["id"])

    host = make_host(queue_size=50)
    host.register(Blocker(), "blocker")
    host.register(Healthy(), "healthy")
    host.start()
    for i in range(2000):  # 40 times the bound
        host.collaboration(_outcome(i))
        if i % 50 == 49:  # let the healthy worker keep up, as a daemon's routing loop would
            assert _wait_for(lambda i=i: len(healthy) == i + 1), (len(healthy), i)
    assert healthy == [str(i) for i in range(2000)]
    assert host.stats["dropped:healthy"] == 0
    assert host.stats["dropped:blocker"] >= 2000 - 51  # its own queue, plus the call it is in
    assert host.stats["dropped"] == host.stats["dropped:blocker"]
    assert host.queue_depths()["blocker"] == 50
    release.set()
    host.stop(timeout=10)


# -- [plugins.NAME] settings ----------------------------------------------------------------------


SETTINGS_MODULE = """
    from pathlib import Path
    from pydantic import BaseModel, Field
    from meshd.hookspecs import hookimpl

    class Settings(BaseModel):
        db_path: Path
        batch: int = Field(default=100, ge=1)

    configured = []

    @hookimpl
    def meshd_plugin_config():
        return Settings

    @hookimpl
    def meshd_configure(config):
        configured.append(config)
"""


def test_a_plugin_reads_its_own_section(make_host: Callable[..., PluginHost], plugin_dir: Path) -> None:
    _write_module(plugin_dir, "meshd_test_settings", SETTINGS_MODULE)
    host = make_host("meshd_test_settings",
                     sections={"meshd_test_settings": {"db_path": "/tmp/x.db", "queue_size": 7}})
    host.load()
    module = sys.modules["meshd_test_settings"]
    (config,) = module.configured
    assert config.db_path == Path("/tmp/x.db") and config.batch == 100  # defaults filled in
    assert host.configs["meshd_test_settings"] is config
    assert host.options["meshd_test_settings"].queue_size == 7  # meshd's key, never the model's


@pytest.mark.parametrize(("section", "key", "words"), [
    ({}, "plugins.meshd_test_settings.db_path", "Field required"),
    ({"db_path": "/x", "batch": 0}, "plugins.meshd_test_settings.batch", "greater than or equal to 1"),
    ({"db_path": "/x", "isolation": "fork"}, "plugins.meshd_test_settings.isolation", "'thread', 'process'"),
    ({"db_path": "/x", "queue_size": 0}, "plugins.meshd_test_settings.queue_size", "integer >= 1"),
])
def test_a_bad_section_is_an_error_naming_plugin_and_key(
        make_host: Callable[..., PluginHost], plugin_dir: Path, section: dict[str, Any], key: str,
        words: str) -> None:
    _write_module(plugin_dir, "meshd_test_settings", SETTINGS_MODULE)
    host = make_host("meshd_test_settings", sections={"meshd_test_settings": section})
    with pytest.raises(ConfigError) as err:
        host.load()
    assert err.value.key == key
    assert words in str(err.value) and "meshd_test_settings" in str(err.value)
    assert sys.modules["meshd_test_settings"].configured == []


def test_a_section_for_a_plugin_without_settings_is_an_error(make_host: Callable[..., PluginHost],
                                                             plugin_dir: Path) -> None:
    _write_module(plugin_dir, "meshd_test_good", GOOD_MODULE)
    host = make_host("meshd_test_good", sections={"meshd_test_good": {"db_path": "/x"}})
    with pytest.raises(ConfigError) as err:
        host.load()
    assert err.value.key == "plugins.meshd_test_good.db_path"
    assert "declares no settings" in str(err.value)
    # meshd's own keys are fine without a model
    host = make_host("meshd_test_good", sections={"meshd_test_good": {"queue_size": 3}})
    host.load()
    assert host.list_plugins()[0]["queue_size"] == 3


def test_a_section_for_a_plugin_not_loaded_is_logged_and_ignored(
        make_host: Callable[..., PluginHost], plugin_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    _write_module(plugin_dir, "meshd_test_good", GOOD_MODULE)
    host = make_host("meshd_test_good", sections={"not_installed": {"anything": 1}})
    with caplog.at_level(logging.WARNING, logger="meshd.plugins"):
        host.load()
    assert "[plugins.not_installed] names no loaded plugin; ignored" in caplog.text
    assert [p["name"] for p in host.list_plugins()] == ["meshd_test_good"]


def test_a_plugin_config_hook_that_raises_is_a_load_failure(make_host: Callable[..., PluginHost],
                                                            plugin_dir: Path) -> None:
    _write_module(plugin_dir, "meshd_test_badcfg", """
        from meshd.hookspecs import hookimpl

        @hookimpl
        def meshd_plugin_config():
            raise RuntimeError("bug")
    """)
    _write_module(plugin_dir, "meshd_test_good", GOOD_MODULE)
    host = make_host("meshd_test_badcfg", "meshd_test_good")
    host.load()
    plugins = {p["name"]: p["status"] for p in host.list_plugins()}
    assert plugins == {"meshd_test_badcfg": "failed", "meshd_test_good": "loaded"}
    assert host.stats["load_failed:meshd_test_badcfg"] == 1


def test_observers_start_after_startup_and_end_before_shutdown(make_host: Callable[..., PluginHost]) -> None:
    calls: list[str] = []

    class P:
        @hookimpl
        async def meshd_startup(self) -> None:
            await asyncio.sleep(0.05)
            calls.append("startup")

        @hookimpl
        def meshd_collaboration(self, outcome: dict[str, Any]) -> None:
            calls.append(outcome["id"])

        @hookimpl
        def meshd_shutdown(self) -> None:
            calls.append("shutdown")

    host = make_host()
    host.register(P(), "p")

    async def node_lifecycle() -> None:
        host.collaboration(_outcome("early"))  # before start-up: waits in the queue
        await host.startup(object())
        host.start()
        host.collaboration(_outcome("during"))
        await host.shutdown(object())
        host.collaboration(_outcome("late"))  # after shutdown: dropped and counted

    asyncio.run(node_lifecycle())
    assert calls == ["startup", "early", "during", "shutdown"]
    assert host.stats["dropped:p"] == 1


def test_config_file_sections_and_module_list(tmp_path: Path) -> None:
    from meshd.config.settings import load_settings

    conf = tmp_path / "meshd.toml"
    conf.write_text('plugin_queue_size = 50\n[plugins]\nmodules = ["my_audit"]\n\n'
                    '[plugins.my_audit]\ndb_path = "/x.db"\nisolation = "process"\n\n[plugins.other]\n')
    s = load_settings(conf, environ={"HOME": str(tmp_path)})
    assert s.plugins == ["my_audit"]
    assert s.plugin_sections == {"my_audit": {"db_path": "/x.db", "isolation": "process"}, "other": {}}
    assert s.plugin_queue_size == 50
    conf.write_text('[plugins.my_audit]\ndb_path = "/x.db"\n')  # sections alone: entry points only
    s = load_settings(conf, environ={"HOME": str(tmp_path)})
    assert s.plugins == [] and s.plugin_sections == {"my_audit": {"db_path": "/x.db"}}
    conf.write_text("[plugins]\nmy_audit = 1\n")
    with pytest.raises(ConfigError) as err:
        load_settings(conf, environ={"HOME": str(tmp_path)})
    assert err.value.key == "plugins.my_audit"
    conf.write_text("plugin_queue_size = 0\n")
    with pytest.raises(ConfigError) as err:
        load_settings(conf, environ={"HOME": str(tmp_path)})
    assert err.value.key == "plugin_queue_size"
