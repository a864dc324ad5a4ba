"""DaemonProcess (meshd/util/daemon_process.py), the one helper that runs a daemon for the fixtures,
the demo and the bench: a daemon that cannot start is a typed error carrying its log; a started one
stops cleanly."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshd import Agent
from meshd.testing import short_tempdir
from meshd.util.daemon_process import DaemonExited, DaemonProcess
from meshd.wire.system_names import TOPIC_LIST, system_agent_name


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = short_tempdir("mshdp-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_daemon_that_exits_while_starting_is_a_typed_error_with_its_log(workdir: Path) -> None:
    d = DaemonProcess("p", f"t{uuid.uuid4().hex[:12]}", workdir / "p",
                      args=["--interface", "127.0.0.1", "--port", "not-a-port"])
    d.start()
    try:
        with pytest.raises(DaemonExited) as err:
            d.wait_ready(timeout=30)
        assert err.value.returncode == 2
        assert "port" in str(err.value), "the log tail names the bad key"
        assert not d.alive()
    finally:
        d.kill()


def test_a_started_daemon_is_ready_and_stops_with_exit_0(workdir: Path) -> None:
    d = DaemonProcess("p", f"t{uuid.uuid4().hex[:12]}", workdir / "p",
                      args=["--interface", "127.0.0.1", "--no-discovery"])
    d.start()
    try:
        assert d.wait_ready(timeout=30) > 0
        assert d.alive() and d.socket.exists() and d.pid > 0
        # ready means READY=1: every start step ran, so the system agent already serves tools
        async def tools() -> list[dict[str, Any]]:
            async with Agent("probe", socket=d.socket) as me:
                return list(await me.request(system_agent_name(str(me.node)), TOPIC_LIST, {}, timeout=5))
        assert {t["name"] for t in asyncio.run(tools())} >= {"list_agents", "create_task"}
        assert d.stop(timeout=10) == 0
        assert d.exited() == 0
        assert not d.notify_path.exists()
    finally:
        d.kill()
