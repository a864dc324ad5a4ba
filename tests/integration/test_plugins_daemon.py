"""Plugins in a real daemon: a pip-installed third-party plugin found through its entry point gets
outcomes and dead letters; plugins that raise or block never slow or stop routing."""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from meshd import Agent, NoSuchAgent
from meshd.testing import MeshdFactory, pip_install, wait_until

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
    env = {"PYTHONPATH": str(installed_plugin), "MESHD_EXAMPLE_OBSERVER_OUT": str(out),
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
    assert sink.exists() and "NO_SUCH_AGENT" in sink.read_text()
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
