"""Plugins in a real daemon: a pip-installed third-party plugin found through its entry point gets
outcomes and dead letters; plugins that raise or block never slow or stop routing."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from meshd import Agent, NoSuchAgent
from meshd.plugins import AUTOLOAD_ENV  # on again: these tests are about entry-point plugins
from meshd.testing import MeshdFactory, pip_install, wait_listed, wait_until

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    pip_install(REPO / "plugins" / "meshd-example-observer", target)
    return target


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_pip_installed_plugin_sees_outcomes_and_dead_letters(meshd_factory: MeshdFactory,
                                                            installed_plugin: Path) -> None:
    out = meshd_factory.workdir / "observer.jsonl"
    env = {"PYTHONPATH": str(installed_plugin), AUTOLOAD_ENV: "0", "MESHD_EXAMPLE_OBSERVER_OUT": str(out),
           "MESHD_DEAD_LETTER_JSONL": "true"}
    a = meshd_factory.spawn("a", env=env)
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])

    async def scenario() -> None:
        async with Agent("asker", socket=a.socket) as asker, Agent("helper", socket=b.socket) as helper:
            helper.on("q")(lambda m: {"a": 1})
            for _ in range(100):
                if "helper" in {x["name"] for x in await asker.agents()}:
                    break
                await asyncio.sleep(0.05)
            assert await asker.request("helper", "q", {}, timeout=5) == {"a": 1}
            await asker.send("helper", "note", {})
            with pytest.raises(NoSuchAgent):
                await asker.request("ghost", "q", {}, timeout=5)
    asyncio.run(scenario())

    def events() -> list[dict[str, Any]]:
        return read_events(out)
    wait_until(lambda: any(e["hook"] == "meshd_dead_letter" for e in events()), what="a dead letter")
    wait_until(lambda: sum(e["hook"] == "meshd_collaboration" for e in events()) >= 3, what="outcomes")
    evs = events()
    hooks = {e["hook"] for e in evs}
    assert {"meshd_startup", "meshd_peer_state", "meshd_agent_state"} <= hooks, hooks
    outcomes = [e for e in evs if e["hook"] == "meshd_collaboration"]
    print("outcomes:", outcomes)
    text = json.dumps(outcomes)
    assert '"request"' in text and '"ok"' in text and '"NO_SUCH_AGENT"' in text and '"sent"' in text
    # the built-in JSONL sink wrote the same dead letter to the state dir
    sink = a.state_dir / "deadletters.jsonl"
    wait_until(lambda: sink.exists() and "NO_SUCH_AGENT" in sink.read_text(),  # written by its worker
               what="the dead letter in the built-in JSONL sink")
    assert a.stop() == 0
    assert any(e["hook"] == "meshd_shutdown" for e in read_events(out))


def test_raising_and_blocking_plugins_do_not_stop_routing(meshd_factory: MeshdFactory) -> None:
    site = meshd_factory.workdir / "badsite"
    site.mkdir()
    # the config names modules; each module is registered as a plugin with its hooks at module level
    (site / "bad_raise.py").write_text(textwrap.dedent('''
        from meshd.hookspecs import hookimpl
        @hookimpl
        def meshd_collaboration(outcome):
            raise RuntimeError("observer bug")
        @hookimpl
        def meshd_agent_state(agent, old, new):
            raise ValueError("another bug")
    '''))
    (site / "bad_sleep.py").write_text(textwrap.dedent('''
        import time
        from meshd.hookspecs import hookimpl
        @hookimpl
        def meshd_collaboration(outcome):
            time.sleep(2)
    '''))
    env = {"PYTHONPATH": str(site), "MESHD_PLUGINS": "bad_raise,bad_sleep"}
    a = meshd_factory.spawn("a", env=env)
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])

    async def scenario() -> float:
        async with Agent("asker", socket=a.socket) as asker, Agent("helper", socket=b.socket) as helper:
            helper.on("q")(lambda m: m.payload)
            for _ in range(100):
                if "helper" in {x["name"] for x in await asker.agents()}:
                    break
                await asyncio.sleep(0.05)
            t0 = time.monotonic()
            for i in range(200):  # each outcome makes the sleeping plugin sleep 2 s
                assert await asker.request("helper", "q", i, timeout=5) == i
            return time.monotonic() - t0
    elapsed = asyncio.run(scenario())
    print(f"200 requests with a raising and a 2 s-blocking observer took {elapsed:.2f} s")
    info = a.query("node")
    assert a.alive()
    assert info["plugins"]["stats"].get("failed:bad_raise", 0) >= 1, info["plugins"]
    assert info["plugins"]["stats"].get("dropped", 0) >= 0


# -- settings, per-plugin queues, process isolation, and what the docs promise ------------------

RECORDER = '''
    import json, os, threading
    from pathlib import Path
    from pydantic import BaseModel
    from meshd.hookspecs import hookimpl

    class Settings(BaseModel):
        out: Path

    _lock = threading.Lock()
    _out = None

    def _emit(hook, **fields):
        with _lock, open(_out, "a") as fh:
            fh.write(json.dumps({"hook": hook, "pid": os.getpid(), **fields}, default=str) + "\\n")

    @hookimpl
    def meshd_plugin_config():
        return Settings

    @hookimpl
    def meshd_configure(config):
        global _out
        _out = config.out
        _emit("meshd_configure")

    @hookimpl
    def meshd_startup(node):
        _emit("meshd_startup", node=node.node_id, name=node.name)

    @hookimpl
    def meshd_collaboration(outcome):
        _emit("meshd_collaboration", **outcome)

    @hookimpl
    def meshd_peer_state(peer, old, new):
        _emit("meshd_peer_state", peer=peer, old=old, new=new)

    @hookimpl
    def meshd_agent_state(agent, old, new):
        _emit("meshd_agent_state", agent=agent, old=old, new=new)

    @hookimpl
    def meshd_shutdown(node):
        _emit("meshd_shutdown")
'''

BLOCKER = '''
    import threading
    from meshd.hookspecs import hookimpl

    @hookimpl
    def meshd_collaboration(outcome):
        threading.Event().wait(60)
'''

CPU_HOG = '''
    from meshd.hookspecs import hookimpl

    @hookimpl
    def meshd_collaboration(outcome):
        n = 0
        for i in range(300_000):  # pure Python: holds the interpreter lock while it runs
            n += i * i
'''


def _site(workdir: Path, **modules: str) -> Path:
    site = workdir / "site"
    site.mkdir(exist_ok=True)
    for name, source in modules.items():
        (site / f"{name}.py").write_text(textwrap.dedent(source))
    return site


def _config(path: Path, modules: list[str], sections: dict[str, dict[str, Any]]) -> Path:
    lines = ["[plugins]", f"modules = {json.dumps(modules)}", ""]
    for name, section in sections.items():
        lines.append(f"[plugins.{name}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in section.items()]
        lines.append("")
    path.write_text("\n".join(lines))
    return path


async def _requests(asker_socket: Path, helper_socket: Path, n: int) -> None:
    async with Agent("asker", socket=asker_socket) as asker, Agent("helper", socket=helper_socket) as helper:
        helper.on("q")(lambda m: m.payload)
        await wait_listed(asker, "helper")
        for i in range(n):
            assert await asker.request("helper", "q", i, timeout=5) == i


def _live_pids() -> dict[int, int]:
    """pid -> parent pid of every process that is not a zombie."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                out[int(entry.name)] = int(fields[1])
    return out


def _children(pid: int) -> list[int]:
    return [child for child, parent in _live_pids().items() if parent == pid]


def test_a_blocked_plugin_does_not_starve_another_in_a_daemon(meshd_factory: MeshdFactory) -> None:
    work = meshd_factory.workdir
    site = _site(work, recorder=RECORDER, blocker=BLOCKER)
    out = work / "recorder.jsonl"
    conf = _config(work / "a.toml", ["blocker", "recorder"],
                   {"blocker": {"queue_size": 20}, "recorder": {"out": str(out)}})
    a = meshd_factory.spawn("a", "--config", str(conf), env={"PYTHONPATH": str(site)})
    asyncio.run(_requests(a.socket, a.socket, 300))
    seen: list[int] = []

    def outcomes() -> bool:
        seen.append(sum(e["hook"] == "meshd_collaboration" for e in read_events(out)))
        return seen[-1] >= 300
    try:
        wait_until(outcomes, what="every outcome at the healthy plugin")
    finally:  # on a time-out: how far it got, and where the rest went
        print("outcomes seen by the recorder:", seen[-3:], "plugins:", a.query("node")["plugins"])
    assert seen[-1] == 300
    stats = a.query("node")["plugins"]["stats"]
    print("plugin stats with one blocked plugin:", stats)
    assert stats.get("dropped:recorder", 0) == 0
    assert stats["dropped:blocker"] >= 300 - 21  # its bound, plus the call it is stuck in
    assert a.stop() == 0


def test_process_isolation_in_a_daemon_and_children_die_with_it(meshd_factory: MeshdFactory,
                                                                installed_plugin: Path) -> None:
    work = meshd_factory.workdir
    site = _site(work, cpu_hog=CPU_HOG)
    out = work / "observer.jsonl"
    conf = _config(work / "a.toml", ["cpu_hog"], {
        "cpu_hog": {"isolation": "process"},
        "example_observer": {"isolation": "process", "out": str(out)},
    })
    env = {"PYTHONPATH": f"{site}:{installed_plugin}", AUTOLOAD_ENV: "0"}
    a = meshd_factory.spawn("a", "--config", str(conf), env=env)
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    asyncio.run(_requests(a.socket, b.socket, 50))
    wait_until(lambda: sum(e["hook"] == "meshd_collaboration" for e in read_events(out)) >= 50,
               what="outcomes in the observer's child")
    # every outcome reaches the busy plugin too, in its own time (configure, startup, 50 events each)
    info = wait_until(lambda: (i := a.query("node"))["plugins"]["stats"]["called"] >= 2 + 2 * 50 and i,
                      timeout=60, what="the busy child to catch up")
    assert set(info["plugins"]["queues"]) == {"cpu_hog", "example_observer"}
    assert not [k for k in info["plugins"]["stats"] if k.startswith(("failed", "restarted"))]
    children = wait_until(lambda: len(_children(a.pid)) >= 2 and _children(a.pid), what="two plugin children")
    a.kill()  # SIGKILL: no shutdown hook, no cleanup; the children must still go
    wait_until(lambda: not set(children) & set(_live_pids()), what="the plugin children to die with it")


def test_a_bad_plugin_setting_stops_start_up_naming_plugin_and_key(meshd_factory: MeshdFactory) -> None:
    work = meshd_factory.workdir
    site = _site(work, recorder=RECORDER)
    conf = _config(work / "a.toml", ["recorder"], {"recorder": {"out": str(work / "x"), "colour": "red"}})
    (site / "recorder.py").write_text((site / "recorder.py").read_text().replace(
        "class Settings(BaseModel):", "class Settings(BaseModel, extra='forbid'):"))
    a = meshd_factory.spawn("a", "--config", str(conf), env={"PYTHONPATH": str(site)}, wait=False)
    assert a.proc is not None
    assert a.proc.wait(30) == 2
    assert "config error: plugins.recorder.colour: plugin 'recorder'" in a.log(), a.log()


def test_what_the_hooks_see_across_two_daemons(meshd_factory: MeshdFactory) -> None:
    work = meshd_factory.workdir
    site = _site(work, recorder=RECORDER)
    outs = {name: work / f"{name}.jsonl" for name in ("a", "b")}
    nodes = {}
    for name in ("a", "b"):
        conf = _config(work / f"{name}.toml", ["recorder"], {"recorder": {"out": str(outs[name])}})
        nodes[name] = meshd_factory.spawn(name, "--config", str(conf), env={"PYTHONPATH": str(site)})
    a, b = nodes["a"], nodes["b"]
    meshd_factory.wait_mesh([a, b])
    asyncio.run(_requests(a.socket, b.socket, 3))
    wait_until(lambda: sum(e["hook"] == "meshd_collaboration" for e in read_events(outs["a"])) >= 3,
               what="outcomes on the initiator's daemon")
    assert a.stop() == 0 and b.stop() == 0
    ev = {name: read_events(path) for name, path in outs.items()}
    # meshd_collaboration fires on the initiator's daemon only
    assert not [e for e in ev["b"] if e["hook"] == "meshd_collaboration"]
    # meshd_agent_state fires only on the agent's own daemon
    agents = {name: {e["agent"]["name"] for e in events if e["hook"] == "meshd_agent_state"}
              for name, events in ev.items()}
    assert "asker" in agents["a"] and "helper" not in agents["a"]
    assert "helper" in agents["b"] and "asker" not in agents["b"]
    # a peer seen for the first time comes from "offline"
    first_peer = next(e for e in ev["a"] if e["hook"] == "meshd_peer_state")
    assert (first_peer["old"], first_peer["peer"]["node"]) == ("offline", b.node_id)
    for events in ev.values():
        hooks = [e["hook"] for e in events]
        # configure, then startup before any observer event; shutdown is the last call
        assert hooks[:2] == ["meshd_configure", "meshd_startup"], hooks
        assert hooks[-1] == "meshd_shutdown" and hooks.count("meshd_shutdown") == 1, hooks
        assert {e["pid"] for e in events} == {events[0]["pid"]}  # thread mode: the daemon's process
    assert ev["a"][1]["node"] == a.node_id and ev["a"][1]["name"] == "a"


def test_the_whole_plugin_example_in_the_docs_passes(tmp_path: Path) -> None:
    """docs/plugins.md "A whole plugin, tested": the plugin and its test, run as a plugin author would."""
    doc = (REPO / "docs" / "plugins.md").read_text()
    files = dict(re.findall(r"<!-- file: (\S+) -->\n```python\n(.*?)```", doc, flags=re.DOTALL))
    assert set(files) == {"meshd_audit.py", "test_meshd_audit.py"}
    for name, source in files.items():
        (tmp_path / name).write_text(source)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False)
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout + run.stderr


def test_node_query_shows_the_documented_plugin_counters(meshd_factory: MeshdFactory) -> None:
    work = meshd_factory.workdir
    site = _site(work, recorder=RECORDER)
    conf = _config(work / "a.toml", ["recorder"], {"recorder": {"out": str(work / "r.jsonl")}})
    a = meshd_factory.spawn("a", "--config", str(conf), env={"PYTHONPATH": str(site)})
    plugins = a.query("node")["plugins"]
    # docs/plugins.md, "Counters: where to read them"
    assert set(plugins) == {"stats", "queued", "queues", "loaded", "hook_time"}
    assert plugins["loaded"] == ["recorder"] and set(plugins["queues"]) == {"recorder"}
    assert plugins["stats"]["called"] >= 1  # meshd_configure, in the constructor

    # The agent socket answers before the plugins step ran meshd_startup, and agents coming and
    # going (the system agent, each query's own probe) put agent_state events in the queue for a
    # moment: wait for both to settle.
    def settled() -> bool:
        now = a.query("node")["plugins"]
        return bool(now["queues"] == {"recorder": 0} and now["stats"]["called"] >= 2)  # + meshd_startup
    wait_until(settled, what="meshd_startup called and an empty queue")


def test_a_cpu_busy_thread_plugin_is_named_with_its_hook_time(meshd_factory: MeshdFactory) -> None:
    """A third-party observer that holds the CPU in the default thread mode: the daemon warns,
    naming it and the cure (isolation = "process"); `meshctl plugins` and the node's counters
    show the time spent in its hook."""
    import subprocess
    import sys

    work = meshd_factory.workdir
    site = _site(work, cpu_hog=CPU_HOG)
    conf = _config(work / "a.toml", ["cpu_hog"], {})
    a = meshd_factory.spawn("a", "--config", str(conf), env={"PYTHONPATH": str(site)})
    asyncio.run(_requests(a.socket, a.socket, 20))

    def slow_counted() -> dict[str, Any] | None:
        plugins = a.query("node")["plugins"]
        calls = plugins["hook_time"].get("cpu_hog", {}).get("meshd_collaboration", {}).get("calls", 0)
        return plugins if calls >= 20 and plugins["stats"].get("slow:cpu_hog") else None
    plugins = wait_until(slow_counted, 30, what="the hog's calls timed and counted slow")
    spent = plugins["hook_time"]["cpu_hog"]["meshd_collaboration"]
    assert spent["cpu_seconds"] >= 20 * 0.005 and spent["seconds"] >= spent["cpu_seconds"] * 0.5
    log = a.log_path.read_text()
    assert "plugin cpu_hog held the CPU" in log and '[plugins.cpu_hog] isolation = "process"' in log
    ctl = [sys.executable, "-c", "import sys; from meshd.cli import meshctl_main; sys.exit(meshctl_main())"]
    done = subprocess.run([*ctl, "--socket", str(a.socket), "plugins", "--json"], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    hog = next(r for r in rows if r["plugin"] == "cpu_hog" and r["hook"] == "meshd_collaboration")
    assert hog["calls"] >= 20 and hog["cpu_ms"] >= 100 and hog["mean_ms"] > 0
    text = subprocess.run([*ctl, "--socket", str(a.socket), "plugins"], capture_output=True, text=True,
                          timeout=30).stdout
    assert "cpu_hog" in text and "meshd_collaboration" in text
