"""An idle daemon with the default config loads only what it uses (its idle memory).

The HTTP gateway is on by default, but aiohttp is imported at its first connection: a real
``meshd run`` has its port bound and ``http.json`` written without aiohttp's compiled modules
mapped in its memory (read from /proc/PID/maps), and the first request loads and serves it.
Likewise pydantic: ``meshd run`` validates its config, re-execs itself with the validated
settings (meshd/daemon/reexec.py), and loads pydantic again only for the tools' argument models.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pydantic_core
import pytest

from meshd import Agent
from meshd.testing import MeshdFactory

AIOHTTP_DIR = Path(aiohttp.__file__).parent


def mapped_from(pid: int, folder: Path) -> list[str]:
    """Files under ``folder`` mapped into process ``pid`` (compiled modules it imported)."""
    prefix = str(folder) + "/"
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return sorted({line.split(maxsplit=5)[-1] for line in lines if prefix in line})


@pytest.mark.skipif(not list(AIOHTTP_DIR.glob("*.so")), reason="aiohttp without compiled modules")
def test_idle_daemon_loads_aiohttp_only_at_the_first_http_request(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")  # default config: http on
    gw = a.gateway()
    a.info()  # the agent socket answers: every start step ran
    assert mapped_from(a.pid, AIOHTTP_DIR) == [], "an idle daemon imported aiohttp"

    req = urllib.request.Request(gw.url + "v1/node", headers={"Authorization": f"Bearer {gw.token}"})
    with urllib.request.urlopen(req, timeout=20) as resp:
        assert resp.status == 200
        assert json.loads(resp.read())["node"] == a.node_id
    assert mapped_from(a.pid, AIOHTTP_DIR) != [], "the gateway served HTTP without aiohttp?"


PYDANTIC_CORE_DIR = Path(pydantic_core.__file__).parent


def test_idle_daemon_runs_without_pydantic_until_a_tool_is_listed(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    a.info()
    cmdline = Path(f"/proc/{a.pid}/cmdline").read_bytes().split(b"\0")
    assert b"--settings-fd" in cmdline, "meshd run did not re-exec with its validated settings"
    assert mapped_from(a.pid, PYDANTIC_CORE_DIR) == [], "an idle daemon imported pydantic"

    async def list_tools() -> list[dict[str, Any]]:
        async with Agent("probe", socket=a.socket) as me:
            return await me.tools()

    names = {t["name"] for t in asyncio.run(list_tools())}
    assert {"ask_agent", "send_message", "list_agents"} <= names
    assert mapped_from(a.pid, PYDANTIC_CORE_DIR) != [], "tool schemas without pydantic?"
