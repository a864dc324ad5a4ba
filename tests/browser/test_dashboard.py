"""The live dashboard in a real browser: Debian's chromium, headless, driven by playwright.

Two daemons; the page on daemon a; an agent attaches on daemon b and shows on the page within
2 s; it stops heartbeating (SIGSTOP) and the page shows it stale. A screenshot is kept.
The playwright browser download is never used (never run ``playwright install``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from meshd.gateway.auth import GatewayAddress
from meshd.testing import MeshdFactory

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is missing "
                                "(apt-get install chromium; .ci/run installs it)")


def _post(gw: GatewayAddress, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(gw.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {gw.token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_dashboard_shows_agents_live(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (the test extra) is missing")
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])

    gw = a.gateway()
    meshctl = str(Path(sys.executable).parent / "meshctl")
    agent: subprocess.Popen[bytes] | None = None
    # an HTTP agent on a, heartbeating with telemetry from a thread
    painter = _post(gw, "v1/agents/register", {"name": "painter", "model": "model-x", "colour": "#e07b39"})
    planner = _post(gw, "v1/agents/register", {"name": "planner"})
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            _post(gw, f"v1/agents/{painter['session_id']}/heartbeat",
                  {"context_used_pct": 37, "queue_depth": 2, "tasks_summary": "2 open, 5 done"})
            _post(gw, f"v1/agents/{planner['session_id']}/heartbeat",
                  {"tasks_summary": {"total": 5, "completed": 2, "in_progress": 1}})
            stop.wait(0.2)
    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            page.goto(f"{gw.url}#token={gw.token}")
            sync_api.expect(page.locator("#status")).to_contain_text("live", timeout=10_000)
            assert "token" not in page.url  # taken from the fragment, then cleared
            sync_api.expect(page.locator("#nodes")).to_contain_text("b (", timeout=10_000)

            painted = page.locator("#agents tr", has_text="painter")
            sync_api.expect(painted).to_contain_text("model-x", timeout=5_000)
            sync_api.expect(painted).to_contain_text("37%")
            sync_api.expect(painted).to_contain_text("2 open, 5 done")
            planned = page.locator("#agents tr", has_text="planner")  # a summary map: a progress bar
            sync_api.expect(planned).to_contain_text("2/5 done · 1 running", timeout=5_000)
            assert planned.locator("progress").get_attribute("value") == "2"
            assert "{" not in planned.inner_text()  # never raw JSON

            agent = subprocess.Popen([meshctl, "--socket", str(b.socket), "agent", "browser-seen", "--echo"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            row = page.locator("#agents tr", has_text="browser-seen")
            sync_api.expect(row).to_be_visible(timeout=2_000)
            sync_api.expect(row).to_contain_text("online")

            answer = _post(gw, "v1/request", {"session_id": painter["session_id"], "target": "browser-seen",
                                              "topic": "paint", "payload": {"colour": "orange"}})
            assert answer["ok"] is True
            outcome = page.locator("#outcomes tr", has_text="browser-seen")
            sync_api.expect(outcome).to_contain_text("painter", timeout=5_000)
            sync_api.expect(outcome).to_contain_text("ok")

            # the charts: drawn from samples the gateway kept since its start (before the page opened)
            legend = page.locator("#chart-legend").inner_text()
            assert "messages/s" in legend and int(legend.rsplit("·", 1)[1].split()[0]) >= 1, legend
            points = page.locator("#line-rate").get_attribute("points") or ""
            assert len(points.split()) >= 1 and all("," in p for p in points.split()), points

            os.kill(agent.pid, signal.SIGSTOP)  # it stops heartbeating
            sync_api.expect(row.locator(".state")).to_have_text("stale", timeout=10_000)
            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"dashboard screenshot: {shot}")
            assert shot.stat().st_size > 10_000
        finally:
            stop.set()
            beater.join(5)
            browser.close()
            if agent is not None:
                os.kill(agent.pid, signal.SIGCONT)
                agent.terminate()
                agent.wait(10)
    assert gw.token not in a.log()
