"""plugins/meshd-example-tools pip-installed like a third-party distribution: a real daemon finds it
through its entry point, serves its tools next to the built-ins, validates their arguments and
passes the one with side effects through the approval policy."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import pytest

from meshd import Agent
from meshd.errors import ApprovalDenied, NoSuchAgent, ValidationFailed
from meshd.plugins import AUTOLOAD_ENV  # on again: these tests are about entry-point plugins
from meshd.testing import MeshdFactory, async_wait_until, pip_install, wait_listed

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed_tools(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    pip_install(REPO / "plugins" / "meshd-example-tools", target)
    return target


def test_pip_installed_tool_plugin(meshd_factory: MeshdFactory, installed_tools: Path,
                                   tmp_path: Path) -> None:
    conf = tmp_path / "meshd.toml"
    conf.write_text(textwrap.dedent("""
        [tools]
        approval = { leave_note = "deny" }
        approval_timeout = 5.0
    """))
    a = meshd_factory.spawn("a", "--config", str(conf), env={"PYTHONPATH": str(installed_tools),
                                                                 AUTOLOAD_ENV: "0"})
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])

    async def scenario() -> None:
        async with Agent("llm", socket=a.socket) as me, \
                Agent("busy", socket=b.socket, capabilities=["search"]) as busy, \
                Agent("idle", socket=b.socket, capabilities=["search"]) as idle:
            busy.set_telemetry(queue_depth=7)
            idle.set_telemetry(queue_depth=1)
            tools = {t["name"]: t for t in await me.tools()}
            assert tools["pick_agent"]["plugin"] == "example_tools"
            assert tools["leave_note"]["side_effects"] is True and "list_agents" in tools
            await wait_listed(me, "busy", "idle")

            async def picked() -> Any:
                choice = await me.call_tool("pick_agent", {"capability": "search"})
                return choice if choice["agent"] == "idle" and choice["queue_depth"] == 1 else None
            choice = await async_wait_until(picked, what="both agents' telemetry")
            assert choice["node"] == "b" and choice["candidates"] == 2
            with pytest.raises(NoSuchAgent, match="'cook'"):
                await me.call_tool("pick_agent", {"capability": "cook"})
            with pytest.raises(ValidationFailed, match="'text'"):
                await me.call_tool("leave_note", {"agent": "idle", "text": "x" * 501})
            with pytest.raises(ApprovalDenied, match="config"):
                await me.call_tool("leave_note", {"agent": "idle", "text": "hi"})
            # a note nobody approved never arrived: the first note idle gets is a direct one
            notes: asyncio.Queue[Any] = asyncio.Queue()
            idle.on("note")(lambda msg: notes.put_nowait(msg.payload))
            await me.send("idle", "note", {"text": "direct"})
            assert (await asyncio.wait_for(notes.get(), 10))["text"] == "direct"

    asyncio.run(scenario())
