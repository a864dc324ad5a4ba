"""Content-based routing on real daemons with plugins/meshd-example-router pip-installed like a
third-party distribution: route:<name> by header, by payload (the plugin asks for it) and by name,
to the least-loaded agent on another node; batches, cancel, and NO_SUCH_AGENT naming the route."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from meshd import Agent, NoSuchAgent
from meshd.plugins import AUTOLOAD_ENV
from meshd.testing import MeshdFactory, MeshdProcess, async_wait_until, pip_install, wait_listed, wait_until

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed_router(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    pip_install(REPO / "plugins" / "meshd-example-router", target)
    return target


def routed_pair(meshd_factory: MeshdFactory, site: Path) -> tuple[MeshdProcess, MeshdProcess]:
    a = meshd_factory.spawn("a", env={"PYTHONPATH": str(site), AUTOLOAD_ENV: "0"})
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    return a, b


def test_routes_by_header_payload_and_name_to_the_least_loaded(meshd_factory: MeshdFactory,
                                                                installed_router: Path) -> None:
    a, b = routed_pair(meshd_factory, installed_router)

    async def scenario() -> None:
        async with Agent("me", socket=a.socket) as me, \
                Agent("inv1", socket=b.socket, capabilities=["invoices"]) as inv1, \
                Agent("inv2", socket=b.socket, capabilities=["invoices"]) as inv2, \
                Agent("refunds", socket=b.socket, capabilities=["refunds"]) as refunds:
            got: dict[str, list[Any]] = {"inv1": [], "inv2": [], "refunds": []}
            for ag in (inv1, inv2, refunds):
                ag.on("note")(lambda m, n=ag.name: got[n].append(m.payload))
                ag.on("verify")(lambda m, n=ag.name: n)
            inv1.set_telemetry(queue_depth=9)
            inv2.set_telemetry(queue_depth=1)
            inv1.heartbeat()
            inv2.heartbeat()
            await wait_listed(me, "inv1", "inv2", "refunds")

            async def loads_known() -> bool:
                recs = {r["name"]: r for r in await me.agents()}
                return all((recs.get(n, {}).get("telemetry") or {}).get("queue_depth") == q
                           for n, q in (("inv1", 9), ("inv2", 1)))
            await async_wait_until(loads_known)
            assert await me.request("route:invoices", "verify", None, timeout=10) == "inv2"  # by name
            assert await me.request("route:any", "verify", None, timeout=10,
                                    headers={"capability": "refunds"}) == "refunds"  # by header
            assert await me.request("route:triage", "verify", {"kind": "refunds"}, timeout=10) == "refunds"
            for i in range(50):  # piles up into batches: each message is routed on its own
                await me.send("route:invoices", "note", i)
            await async_wait_until(lambda: len(got["inv2"]) == 50)
            assert got["inv2"] == list(range(50)) and not got["inv1"]
            with pytest.raises(NoSuchAgent, match="route:cooking"):
                await me.request("route:cooking", "verify", None, timeout=10)
            with pytest.raises(NoSuchAgent, match="route:triage"):
                await me.request("route:triage", "verify", {"kind": "nobody"}, timeout=10)
        stats = a.query("node")["stats"]
        assert stats["routed"] >= 53 and stats["route_unchosen"] >= 2
        assert stats["route_payload_decoded"] == 2  # only route:triage asked for payloads

    asyncio.run(scenario())


def test_a_cancel_follows_its_routed_request(meshd_factory: MeshdFactory, installed_router: Path) -> None:
    a, b = routed_pair(meshd_factory, installed_router)

    async def scenario() -> None:
        async with Agent("me", socket=a.socket) as me, \
                Agent("slow", socket=b.socket, capabilities=["slow"]) as slow:
            started, told = asyncio.Event(), asyncio.Event()

            @slow.on("work")
            async def work(msg: Any) -> Any:
                started.set()
                try:
                    await asyncio.wait_for(msg.cancelled.wait(), 20)
                    told.set()
                except TimeoutError:
                    pass
                return None

            await wait_listed(me, "slow")
            task = asyncio.ensure_future(me.request("route:slow", "work", None, timeout=20))
            await asyncio.wait_for(started.wait(), 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(told.wait(), 10)

    asyncio.run(scenario())


def test_without_a_routing_plugin_a_route_is_just_an_unknown_name(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")

    async def scenario() -> None:
        async with Agent("me", socket=a.socket) as me:
            with pytest.raises(NoSuchAgent):
                await me.request("route:invoices", "verify", None, timeout=10)

    asyncio.run(scenario())


CTL = [sys.executable, "-c", "import sys; from meshd.cli import meshctl_main; sys.exit(meshctl_main())"]


def test_routes_and_priorities_from_meshctl_http_and_the_tools(meshd_factory: MeshdFactory,
                                                               installed_router: Path) -> None:
    a, b = routed_pair(meshd_factory, installed_router)

    async def scenario() -> None:
        async with Agent("llm", socket=a.socket) as llm, \
                Agent("inv", socket=b.socket, capabilities=["invoices"]) as inv:
            seen: list[tuple[str, Any]] = []

            @inv.on("verify")
            def verify(msg: Any) -> Any:
                seen.append((msg.sender, msg.payload))
                return "inv"

            await wait_listed(llm, "inv")
            out = await asyncio.to_thread(subprocess.run, [
                *CTL, "--socket", str(a.socket), "request", "route:invoices", "verify", '"ctl"',
                "--priority", "0", "--timeout", "10"], capture_output=True, text=True, timeout=30)
            assert out.returncode == 0 and json.loads(out.stdout) == "inv", out.stderr
            bad = await asyncio.to_thread(subprocess.run, [
                *CTL, "--socket", str(a.socket), "send", "inv", "verify", "1", "--priority", "10"],
                capture_output=True, text=True, timeout=30)
            assert bad.returncode != 0 and "priority" in bad.stderr
            gw = a.gateway()
            async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {gw.token}"}) as http:
                async with http.post(gw.url + "v1/agents/register", json={"name": "web"}) as r:
                    session = (await r.json())["session_id"]
                body = {"session_id": session, "target": "route:invoices", "topic": "verify",
                        "payload": "http", "priority": 1, "timeout": 10}
                async with http.post(gw.url + "v1/request", json=body) as r:
                    assert r.status == 200 and (await r.json())["payload"] == "inv"
                async with http.post(gw.url + "v1/request", json=dict(body, priority=10)) as r:
                    assert r.status == 400  # range-checked at the edge
                async with http.post(gw.url + "v1/request", json=dict(body, target="route:nothing")) as r:
                    got = await r.json()
                    assert r.status == 404 and "route:nothing" in got["error"]["message"]
            assert await llm.call_tool("request_agent", {"agent": "route:invoices", "topic": "verify",
                                                         "payload": "tool", "priority": 0}) == "inv"
            assert [p for _, p in seen] == ["ctl", "http", "tool"]

    asyncio.run(scenario())


def _child_pids(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[1]) == pid:
                children.append(int(entry.name))
    return children


def test_a_process_isolated_routing_plugin_still_routes(meshd_factory: MeshdFactory, installed_router: Path,
                                                        tmp_path: Path) -> None:
    """``isolation = "process"`` for the router: its observer hooks run in a child process, and
    ``meshd_route``, which runs on the routing path, must still choose (docs/plugins.md)."""
    conf = tmp_path / "a.toml"
    conf.write_text('[plugins]\nmodules = ["meshd_example_router"]\n\n'
                    '[plugins.example_router]\nisolation = "process"\n')
    a = meshd_factory.spawn("a", "--config", str(conf),
                            env={"PYTHONPATH": str(installed_router), AUTOLOAD_ENV: "0"})
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    # the plugin is loaded, in a child process of its own (else this test proves nothing)
    assert a.query("node")["plugins"]["loaded"] == ["example_router"]
    wait_until(lambda: _child_pids(a.pid), what="the router plugin's child process")

    async def scenario() -> None:
        async with Agent("me", socket=a.socket) as me, \
                Agent("inv", socket=b.socket, capabilities=["invoices"]) as inv, \
                Agent("refunds", socket=b.socket, capabilities=["refunds"]) as refunds:
            for ag in (inv, refunds):
                ag.on("verify")(lambda m, n=ag.name: n)
            await wait_listed(me, "inv", "refunds")
            assert await me.request("route:invoices", "verify", None, timeout=10) == "inv"  # by name
            assert await me.request("route:any", "verify", None, timeout=10,
                                    headers={"capability": "refunds"}) == "refunds"  # by header
            assert await me.request("route:triage", "verify", {"kind": "refunds"}, timeout=10) == "refunds"
            with pytest.raises(NoSuchAgent, match="route:cooking"):
                await me.request("route:cooking", "verify", None, timeout=10)

    asyncio.run(scenario())
