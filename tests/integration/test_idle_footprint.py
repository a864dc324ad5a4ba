"""An idle daemon with the default config loads only what it uses (issue 11, goal 6: memory).

The HTTP gateway is on by default, but aiohttp is imported at its first connection: a real
``meshd run`` has its port bound and ``http.json`` written without aiohttp's compiled modules
mapped in its memory (read from /proc/PID/maps), and the first request loads and serves it.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import aiohttp
import pytest

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
